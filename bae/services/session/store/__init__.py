"""Persistent state of the session service: keys, profiles, sessions, events."""

from bae.services.session.store.records import KeyRecord, Principal, ProfileRecord, SessionRecord
from bae.services.session.store.store import Store

__all__ = ["KeyRecord", "Principal", "ProfileRecord", "SessionRecord", "Store"]
