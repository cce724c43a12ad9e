"""Retention: the `[retention]` table of bae-config.toml and a profile's `retention` override.

Closed and error sessions are kept `closed_session_days` after their `closed_at`, then the sweep
deletes them (bae/services/session/engine/retention.py), archiving each first when `archive` is
"ndjson". Unset, sessions are kept forever. A profile's `retention.closed_session_days` replaces
the default for its sessions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

# The longest retention a value may ask for: a bound on input (a century), not a policy.
MAX_DAYS = 36500.0
ARCHIVES = ("none", "ndjson")
KEYS = ("closed_session_days", "archive", "archive_dir")


class RetentionError(ValueError):
    """A retention value that does not read; the message names the key and what it takes."""


@dataclass(frozen=True)
class Retention:
    # None: closed sessions are kept forever (unless their profile sets a retention).
    closed_session_days: float | None = None
    archive: str = "none"
    # Where "ndjson" archives go, one `<session id>.ndjson` per session; required with it.
    archive_dir: str | None = None

    def days_for(self, profile_override: Mapping[str, Any] | None) -> float | None:
        """The retention of a session of a profile with this override (None: kept forever)."""
        if profile_override and profile_override.get("closed_session_days") is not None:
            return float(profile_override["closed_session_days"])
        return self.closed_session_days


DEFAULT_RETENTION = Retention()


def read_days(value: Any, where: str) -> float:
    """A number of days: more than 0, at most MAX_DAYS (fractions allowed)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RetentionError(f"{where} must be a number of days")
    if not 0 < value <= MAX_DAYS:
        raise RetentionError(f"{where} must be more than 0 and at most {MAX_DAYS:g} days")
    return float(value)


def read_retention(table: Mapping[str, Any]) -> Retention:
    """The `[retention]` table, checked; unknown keys are refused so a misspelt one never silently does nothing."""
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise RetentionError(f"retention: unknown key `{unknown[0]}`; the keys are {', '.join(KEYS)}")
    days = table.get("closed_session_days")
    archive = table.get("archive", "none")
    if archive not in ARCHIVES:
        raise RetentionError(f"retention.archive must be one of {', '.join(ARCHIVES)}")
    archive_dir = table.get("archive_dir")
    if archive_dir is not None and (not isinstance(archive_dir, str) or not archive_dir.strip()):
        raise RetentionError("retention.archive_dir must be a non-empty path")
    if archive == "ndjson" and archive_dir is None:
        raise RetentionError('retention.archive_dir is required when archive = "ndjson"')
    return Retention(
        closed_session_days=None if days is None else read_days(days, "retention.closed_session_days"),
        archive=archive,
        archive_dir=archive_dir,
    )
