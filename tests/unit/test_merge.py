"""The merge rules of a paused turn's continuation (SERVER-SPEC §7.4)."""

import pytest

from bae.services.session.engine.merge import (
    ABANDONED_TEXT,
    MergeInvalid,
    is_continuation,
    merge_abandonment,
    merge_continuation,
)

pytestmark = pytest.mark.unit

USES = [
    {"type": "tool_use", "id": "tu_1", "name": "clock", "input": {}, "dispatch": "client"},
    {"type": "tool_use", "id": "tu_2", "name": "ls", "input": {}, "dispatch": "mcp"},
]
SERVER = {"tu_2": {"type": "tool_result", "tool_use_id": "tu_2", "content": "server", "is_error": False}}


def result(tool_use_id, content="client"):
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}


def test_owner_continuation_merges_in_tool_use_order_and_server_copy_wins():
    merged = merge_continuation(USES, SERVER, [result("tu_2", "forged"), result("tu_1"), {"type": "text", "text": "hi"}])
    assert merged == [result("tu_1"), SERVER["tu_2"], {"type": "text", "text": "hi"}]


@pytest.mark.parametrize(
    "content, detail",
    [
        ([result("tu_1"), result("tu_1")], 'client returned a duplicate tool_result for id "tu_1"'),
        ([result("tu_9")], 'tool_result id "tu_9" is not in the paused assistant turn'),
        ([result("tu_2")], 'no tool_result for tool_use id "tu_1"'),
    ],
)
def test_invalid_continuations_name_the_problem(content, detail):
    with pytest.raises(MergeInvalid) as info:
        merge_continuation(USES, SERVER, content)
    assert str(info.value) == detail


def test_paused_turn_shape_errors():
    with pytest.raises(MergeInvalid, match="paused assistant turn has no tool_use ids"):
        merge_continuation([], {}, [result("x")])
    with pytest.raises(MergeInvalid, match="duplicate tool_use ids"):
        merge_continuation([USES[0], USES[0]], {}, [result("tu_1")])


def test_plain_message_abandons_with_synthetic_errors_and_keeps_server_results():
    merged = merge_abandonment(USES, SERVER, "never mind", timed_out=False)
    assert merged == [
        {"type": "tool_result", "tool_use_id": "tu_1", "content": ABANDONED_TEXT, "is_error": True},
        SERVER["tu_2"],
        {"type": "text", "text": "never mind"},
    ]


def test_timed_out_reclaim_refuses_tool_results():
    with pytest.raises(MergeInvalid, match="timed-out replacement message must not contain tool_result blocks"):
        merge_abandonment(USES, SERVER, [result("tu_1")], timed_out=True)


def test_continuation_detection():
    assert is_continuation([result("tu_1")])
    assert is_continuation("") and is_continuation([])
    assert not is_continuation("hello")
    assert not is_continuation([{"type": "text", "text": "hello"}])
