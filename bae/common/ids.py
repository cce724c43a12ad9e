"""Identifiers, key tokens and their digests."""

from __future__ import annotations

import hashlib
import hmac
import secrets


def new_id(prefix: str) -> str:
    """`<prefix>` + 32 lowercase hex chars (16 CSPRNG bytes): key_, pro_, ses_, evt_, sba_."""
    return prefix + secrets.token_hex(16)


def new_token(prefix: str) -> str:
    """A key plaintext: `bae_`, `bae_ses_` or `bae_admin_` + 48 hex chars (24 CSPRNG bytes)."""
    return prefix + secrets.token_hex(24)


def token_digest(token: str) -> str:
    """The stored form of a key: lowercase hex SHA-256 of the plaintext (see docs/keys.md)."""
    return hashlib.sha256(token.encode()).hexdigest()


def digests_equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
