"""The web console's session tokens, shared by the gateway (which sets the cookie and checks the
CSRF token) and the session service (which mints and stores the sessions); docs/console.md.

A console session is known by the random value of its `bae_console` cookie. Its CSRF token is
derived from that value (an HMAC keyed with it), so the gateway checks a mutation's X-CSRF-Token
without any state or secret of its own: only whoever holds the cookie's value can compute the
token, and the page learns it from the sign-in answer since its script cannot read the HttpOnly
cookie. The store keeps neither value, only the SHA-256 digest of the cookie's.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

COOKIE_NAME = "bae_console"
SESSION_PREFIX = "bcs_"
LINK_PREFIX = "bcl_"
# A console session ends 12 hours after sign-in at the latest (the cookie's Max-Age).
SESSION_SECONDS = 12 * 60 * 60
# A sign-in link works once, within this many seconds of being made.
LINK_SECONDS = 60
# The longest cookie value or link the services look up; theirs are 52 characters.
MAX_TOKEN_CHARS = 256

_CSRF_CONTEXT = b"bae console csrf v1"


def csrf_token(session_token: str) -> str:
    """The CSRF token of the console session whose cookie holds `session_token`."""
    mac = hmac.new(session_token.encode(), _CSRF_CONTEXT, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")


def csrf_matches(session_token: str, presented: str | None) -> bool:
    """Whether `presented` (the X-CSRF-Token header, None when absent) is the session's CSRF token."""
    if not presented or not presented.isascii():
        return False
    return hmac.compare_digest(csrf_token(session_token).encode(), presented.encode())
