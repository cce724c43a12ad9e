"""When a schedule fires (engine/schedule_times.py): cron expressions read by cronsim in a time zone,
daylight-saving changes as Debian's cron handles them, and the validation texts."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from bae.common.errors import InvalidInput
from bae.services.session.engine.schedule_times import MAX_TICKS_PER_PASS, timing

pytestmark = pytest.mark.unit


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=timezone.utc)


def test_the_next_tick_is_strictly_after_the_moment_and_in_utc():
    every_five = timing("*/5 * * * *", "UTC", test_seconds=False)
    assert every_five.after(utc(2026, 7, 6, 18, 26, 10)) == utc(2026, 7, 6, 18, 30)
    assert every_five.after(utc(2026, 7, 6, 18, 30)) == utc(2026, 7, 6, 18, 35)


def test_fields_are_read_in_the_time_zone():
    morning = timing("0 6 * * 1-5", "Europe/Paris", test_seconds=False)
    # Monday 6 July 2026, 06:00 in Paris (CEST, UTC+2).
    assert morning.after(utc(2026, 7, 5, 12, 0)) == utc(2026, 7, 6, 4, 0)
    # Friday evening: the next is Monday.
    assert morning.after(utc(2026, 7, 10, 12, 0)) == utc(2026, 7, 13, 4, 0)


def test_a_fixed_time_in_the_skipped_spring_hour_runs_once_right_after_the_jump():
    night = timing("30 2 * * *", "Europe/Paris", test_seconds=False)
    # 29 March 2026: 02:00 CET becomes 03:00 CEST; 02:30 does not exist, the run is at 03:00 CEST.
    assert night.after(utc(2026, 3, 28, 12, 0)) == utc(2026, 3, 29, 1, 0)
    assert night.after(utc(2026, 3, 29, 1, 0)) == utc(2026, 3, 30, 0, 30)


def test_a_fixed_time_in_the_repeated_autumn_hour_runs_once():
    night = timing("30 2 * * *", "Europe/Paris", test_seconds=False)
    # 25 October 2026: 03:00 CEST becomes 02:00 CET; 02:30 happens twice, the run once (the first).
    ticks = night.between(utc(2026, 10, 24, 12, 0), utc(2026, 10, 26, 12, 0))
    assert ticks == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]


def test_an_expression_more_frequent_than_hourly_follows_the_clock_through_the_repeated_hour():
    half_hourly = timing("*/30 * * * *", "Europe/Paris", test_seconds=False)
    ticks = half_hourly.between(utc(2026, 10, 24, 23, 45), utc(2026, 10, 25, 1, 45))
    # Local 02:00, 02:30 (CEST), 02:00, 02:30 (CET), 03:00: every half hour of real time.
    assert ticks == [utc(2026, 10, 25, 0, 0), utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 0),
                     utc(2026, 10, 25, 1, 30)]


def test_between_is_after_exclusive_and_until_inclusive_and_bounded():
    every_minute = timing("* * * * *", "UTC", test_seconds=False)
    assert every_minute.between(utc(2026, 1, 1, 0, 0), utc(2026, 1, 1, 0, 3)) == [
        utc(2026, 1, 1, 0, 1), utc(2026, 1, 1, 0, 2), utc(2026, 1, 1, 0, 3)]
    year = every_minute.between(utc(2025, 1, 1), utc(2026, 1, 1))
    assert len(year) == MAX_TICKS_PER_PASS and year[-1] == utc(2026, 1, 1)


def test_six_fields_count_seconds_only_with_the_test_setting():
    every_second = timing("* * * * * *", "UTC", test_seconds=True)
    assert every_second.after(utc(2026, 1, 1, 0, 0, 0)) == utc(2026, 1, 1, 0, 0, 1)
    with pytest.raises(InvalidInput, match=r"expected 5 fields .*got 6"):
        timing("* * * * * *", "UTC", test_seconds=False)


@pytest.mark.parametrize(("cron", "text"), [
    ("* * *", "expected 5 fields (minute hour day-of-month month day-of-week), got 3"),
    ("61 * * * *", 'invalid cron "61 * * * *": '),
    ("* * 31 2 *", 'invalid cron "* * 31 2 *": '),
    ("x" * 201, "cron must be a cron expression of 1 to 200 characters"),
    ("   ", "cron must be a cron expression of 1 to 200 characters"),
])
def test_a_bad_expression_is_refused_with_what_is_wrong(cron: str, text: str):
    with pytest.raises(InvalidInput) as refused:
        timing(cron, "UTC", test_seconds=False)
    assert text in str(refused.value)


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "../etc/passwd", "x" * 65])
def test_a_bad_time_zone_is_refused(zone: str):
    with pytest.raises(InvalidInput, match="timezone"):
        timing("* * * * *", zone, test_seconds=False)
