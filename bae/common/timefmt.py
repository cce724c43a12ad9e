"""Timestamps: RFC 3339 UTC with exactly three fractional digits and a `Z`."""

from __future__ import annotations

from datetime import datetime, timezone


def now() -> str:
    return format_time(datetime.now(timezone.utc))


def format_time(moment: datetime) -> str:
    moment = moment.astimezone(timezone.utc)
    # The year in four digits (strftime's %Y writes 999 for 0999), so that stamps compare as text.
    return f"{moment.year:04d}" + moment.strftime("-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
