"""When a schedule fires: its cron expression and time zone read with cronsim, and the ticks a pass
of the ticker finds due.

cronsim evaluates five-field expressions as Debian's cron does, daylight-saving changes included:
a job at a fixed local time (a set minute and hour) that falls in the hour skipped in spring runs
once, right after the jump; one in the hour repeated in autumn runs once, not twice. Expressions
that run more often than hourly (`*/10 * * * *`) follow the clock as it is, so they do not run in
a skipped hour, and run again in a repeated one. docs/guides/schedules.md says the same for users.

With the test-only setting BAE_SCHEDULE_TEST_SECONDS a six-field expression is also taken, its
first field counting seconds (cronsim's own six-field form), so tests tick every second.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from bae.common.errors import InvalidInput, echo

MAX_CRON_CHARS = 200
MAX_TIMEZONE_CHARS = 64
# A pass looks back at most this many ticks: a schedule that ran every second for a day of downtime
# costs one bounded walk, not 86,400 steps.
MAX_TICKS_PER_PASS = 1000


@dataclass(frozen=True)
class Timing:
    """A schedule's validated cron expression in its time zone."""

    cron: str
    zone: ZoneInfo

    def after(self, moment: datetime) -> datetime:
        """The first tick strictly after `moment` (an aware datetime), in UTC."""
        start = moment.astimezone(self.zone) + timedelta(microseconds=1)
        return next(CronSim(self.cron, start)).astimezone(timezone.utc)

    def between(self, after: datetime, until: datetime) -> list[datetime]:
        """The ticks in (after, until], oldest first, in UTC: at most MAX_TICKS_PER_PASS of the newest."""
        # cronsim walks backwards past a repeated autumn hour without its second pass, so the ticks
        # are found walking forwards; a backward walk of MAX_TICKS_PER_PASS steps finds where to start,
        # so a long gap costs about 2 * MAX_TICKS_PER_PASS steps, not one per tick of the gap.
        start = after
        backwards = CronSim(self.cron, until.astimezone(self.zone) + timedelta(microseconds=1), reverse=True)
        for count, tick in enumerate(backwards, start=1):
            if tick <= after:
                break
            if count == MAX_TICKS_PER_PASS:
                start = max(after, tick - timedelta(seconds=1))
                break
        found: deque[datetime] = deque(maxlen=MAX_TICKS_PER_PASS)
        for tick in CronSim(self.cron, start.astimezone(self.zone)):
            tick = tick.astimezone(timezone.utc)
            if tick > until:
                break
            if tick > after:
                found.append(tick)
        return list(found)


def timing(cron: str, zone_name: str, *, test_seconds: bool) -> Timing:
    """Validate `cron` (five standard fields; six, seconds first, with the test-only setting) and
    `zone_name` (an IANA name); InvalidInput (400) says what is wrong."""
    zone = time_zone(zone_name)
    text = " ".join(cron.split())
    if not text or len(cron) > MAX_CRON_CHARS:
        raise InvalidInput(f"cron must be a cron expression of 1 to {MAX_CRON_CHARS} characters")
    fields = len(text.split())
    allowed = (5, 6) if test_seconds else (5,)
    if fields not in allowed:
        raise InvalidInput(
            f'invalid cron "{echo(cron)}": expected 5 fields (minute hour day-of-month month day-of-week), got {fields}'
        )
    try:
        next(CronSim(text, datetime.now(zone)))
    except (CronSimError, StopIteration, ValueError) as exc:
        raise InvalidInput(f'invalid cron "{echo(cron)}": {echo(str(exc) or "no time matches it")}') from None
    return Timing(text, zone)


def time_zone(name: str) -> ZoneInfo:
    if not name or len(name) > MAX_TIMEZONE_CHARS:
        raise InvalidInput(f"timezone must be an IANA time zone name of 1 to {MAX_TIMEZONE_CHARS} characters")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(f'unknown timezone "{echo(name)}"; expected an IANA name such as "Europe/Paris"') from None
