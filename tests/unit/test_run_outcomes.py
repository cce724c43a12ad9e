"""A resumed run's outcome (a schedule's or a trigger's), read from its session's messages (engine/fire.py)."""

from __future__ import annotations

import pytest

from bae.services.session.engine.fire import TURN_CUT_OFF, outcome_from_log

pytestmark = pytest.mark.unit

USER = ("client.message.send", '{"role":"user","content":"go"}')


@pytest.mark.parametrize(("state", "messages", "outcome"), [
    ("open", [], None),  # the message was never sent: the resumed run sends it
    ("closed", [], ("failed", "the session is closed and its message was never sent")),
    ("open", [USER], ("failed", TURN_CUT_OFF)),
    ("open", [USER, ("server.message.send", '{"role":"assistant","content":[{"type":"text","text":"done"}]}')],
     ("completed", None)),
    ("open", [USER, ("server.message.send",
                     '{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"x","input":{}}]}')],
     ("failed", TURN_CUT_OFF)),
    ("error", [USER], ("failed", "the provider is currently unavailable; the session is in error")),
])
def test_a_resumed_runs_outcome_is_what_its_log_says(state, messages, outcome):
    assert outcome_from_log(state, messages) == outcome
