"""What `promtool check metrics` checks of a /metrics body, plus the naming rules of
https://prometheus.io/docs/practices/naming/ that docs/observability.md promises: the body
parses as the text format, every family has a HELP line, counters and only counters end in
`_total`, units are base units named as a suffix, no reserved suffix on the wrong type.
"""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

_SNAKE_CASE = re.compile(r"[a-z][a-z0-9_]*")
# Units that are not base units, spelt out or abbreviated (promtool's list and the obvious others).
NON_BASE_UNITS = frozenset((
    "ms", "us", "ns", "millis", "milliseconds", "millisecond", "microseconds", "nanoseconds",
    "minutes", "minute", "hours", "hour", "days", "day", "mins",
    "kb", "mb", "gb", "tb", "kib", "mib", "gib", "kilobytes", "megabytes", "gigabytes", "bits",
    "percent", "celsius", "fahrenheit",
))
TYPE_WORDS = frozenset(("counter", "gauge", "histogram", "summary"))
# Words that say the value is a time, or a size: such a family ends in its base unit.
TIME_WORDS = frozenset(("latency", "duration", "time", "delay", "wait", "age", "elapsed"))
SIZE_WORDS = frozenset(("bytes", "size"))
RESERVED_SUFFIXES = ("_count", "_sum", "_bucket", "_created", "_gcount", "_gsum")


def naming_problems(exposition: str) -> list[str]:
    """Every rule a family of `exposition` breaks, as `name: problem`; [] when it follows them all.
    A body that does not parse raises (what promtool reports as a parse error)."""
    problems: list[str] = []
    seen: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        name, kind = family.name, family.type
        problems.extend(f"{name}: {problem}" for problem in _family_problems(name, kind, family.documentation))
        if name in seen:
            problems.append(f"{name}: family written twice")
        seen.add(name)
        for sample in family.samples:
            if kind == "counter" and not sample.name.endswith(("_total", "_created")):
                problems.append(f"{sample.name}: a counter's sample does not end in _total")
            if kind != "counter" and sample.name.endswith("_total"):
                problems.append(f"{sample.name}: only counters end in _total")
    return problems


def _family_problems(name: str, kind: str, documentation: str) -> list[str]:
    problems = []
    if not documentation.strip():
        problems.append("no HELP text")
    if not _SNAKE_CASE.fullmatch(name):
        problems.append("not snake_case (lower case letters, digits, underscores; no colon)")
    words = name.split("_")
    # The parser strips a counter's _total; a family name that still ends in it is a non-counter's.
    if kind != "counter" and name.endswith("_total"):
        problems.append("only counters end in _total")
    if kind in ("counter", "gauge") and name.endswith(RESERVED_SUFFIXES):
        problems.append(f"a {kind} must not end in a histogram or summary suffix")
    for word in words:
        if word in NON_BASE_UNITS:
            problems.append(f'"{word}" is not a base unit (use seconds or bytes)')
        if word in TYPE_WORDS:
            problems.append(f'the name says its type ("{word}")')
    if TIME_WORDS & set(words) and words[-1] != "seconds":
        problems.append("a time ends in _seconds")
    if SIZE_WORDS & set(words) and words[-1] != "bytes":
        problems.append("a size ends in _bytes")
    if kind in ("histogram", "summary") and words[-1] not in ("seconds", "bytes"):
        problems.append(f"a {kind} ends in its base unit (_seconds or _bytes)")
    return problems
