"""The summary `make bench` ends with: each measured path next to the floor it is compared with."""

from __future__ import annotations

from dataclasses import dataclass

ROWS: list["Row"] = []


@dataclass
class Row:
    path: str
    measured: str
    floor: str = "-"
    aim: str = "-"


def record(path: str, measured: str, floor: str = "-", aim: str = "-") -> None:
    ROWS.append(Row(path, measured, floor, aim))


def print_table() -> None:
    if not ROWS:
        return
    print("\n== Summary ==")
    print("| path | measured | floor it is compared with | aim |")
    print("|---|---|---|---|")
    for row in ROWS:
        print(f"| {row.path} | {row.measured} | {row.floor} | {row.aim} |")
