"""baectl's one-field-per-line records."""

from __future__ import annotations

import pytest

from bae.ctl.commands import trigger_record
from bae.ctl.output import labelled

pytestmark = pytest.mark.unit


def test_values_start_at_the_column() -> None:
    assert labelled({"id": "trg_1", "name": "triage"}, ["id", "name"], 8) == ["id:     trg_1", "name:   triage"]


def test_a_triggers_values_line_up_after_its_longest_label() -> None:
    lines = trigger_record({"id": "trg_1", "message_template": "Triage {title}", "input_schema": {"type": "object"}})
    assert "message_template: Triage {title}" in lines.splitlines()
    assert 'input_schema:     {"type":"object"}' in lines.splitlines()  # the same column


def test_a_label_longer_than_the_column_keeps_a_space_before_its_value() -> None:
    assert labelled({"message_template": "x"}, ["message_template"], 10) == ["message_template: x"]
