"""History compaction (SERVER-SPEC §12): the run shared by `session.compact` and
the auto trigger, and the auto trigger's threshold and backoff rules."""

from __future__ import annotations

import json
import logging
from typing import Any

from bae.common.config import Config, primary_not_configured
from bae.services.session.engine.domain import CompactionReason, CompactionTrigger
from bae.services.session.engine.errors import CompactionFailed
from bae.services.session.engine.live import CompactionBackoff, LiveSession
from bae.services.session.engine.turn import Turn
from bae.services.session.engine.ports import StepFailed, StepOutcome
from bae.services.session.store.events import EventView
from bae.services.session.store.records import ProfileRecord, SessionRecord

log = logging.getLogger("bae.session.compaction")

PURPOSE = "compaction"
# Each provider's output budget for a compaction call is at least this (§12.4 step 2).
MIN_OUTPUT_TOKENS = 4096
PREAMBLE_TEXT = "The earlier part of this conversation was compacted. A summary follows."
DEFAULT_PROMPT = (
    "Summarize the conversation so far into a single self-contained summary that can replace it. "
    "Keep every fact, decision, open question, file name, identifier and tool result the rest of the "
    "work depends on, and the user's goals and constraints. Write it as notes for whoever continues "
    "this conversation; do not address the user."
)


def client_prompt(session: SessionRecord, prompt: str | None) -> str:
    """`session.compact`'s instruction: the param, then the stored client-mode prompt, then the default."""
    if prompt is not None:
        return prompt
    config = session.compaction or {}
    stored = config.get("prompt") if config.get("mode") == "client" else None
    return stored if isinstance(stored, str) else DEFAULT_PROMPT


def auto_threshold(session: SessionRecord) -> int | None:
    config = session.compaction or {}
    return config.get("size") if config.get("mode") == "auto" else None


def auto_reason(live: LiveSession, token_count: int | None, size: int) -> CompactionReason | None:
    """Whether a completed turn compacts automatically (§12.2); counts the turn for the backoff."""
    backoff = live.compaction_backoff
    if backoff is not None:
        backoff.turns_since += 1
    if token_count is None or token_count <= size:
        return None
    if backoff is None:
        return CompactionReason.TOKEN_THRESHOLD
    if backoff.turns_since >= 1 and token_count > backoff.failed_token_count:
        return CompactionReason.RETRY_AFTER_FAILURE
    return None


def arm_backoff(live: LiveSession, token_count: int) -> None:
    live.compaction_backoff = CompactionBackoff(failed_token_count=token_count)


async def run_compaction(
    turn: Turn,
    config: Config,
    profile: ProfileRecord,
    *,
    trigger: CompactionTrigger,
    reason: CompactionReason,
    token_count: int | None,
    threshold: int | None,
    instruction: str,
) -> EventView:
    """One compaction (§12.4); returns the `completed` event or raises CompactionFailed.

    A failure leaves only `started` and the provider request/response pairs:
    the effective history is untouched.
    """
    if config.provider(profile.primary_provider) is None:
        raise CompactionFailed(f"provider_config: {primary_not_configured(profile.primary_provider)}")
    history = turn.live.loaded_history
    compacted_message_count = len(history)
    await turn.emit(
        [
            (
                "session.compaction.started",
                {
                    "trigger": str(trigger),
                    "reason": str(reason),
                    "token_count": token_count,
                    "threshold_tokens": threshold,
                },
            )
        ]
    )
    try:
        result = await turn.step(
            profile,
            history.with_instruction(instruction),
            [],
            purpose=PURPOSE,
            min_max_tokens=MIN_OUTPUT_TOKENS,
        )
    except StepFailed as exc:
        await turn.flush()
        raise CompactionFailed(f"the model runner is unreachable ({exc})") from exc
    if result.outcome == StepOutcome.PROVIDER_CONFIG:
        await turn.flush()
        raise CompactionFailed(f"provider_config: {result.detail}")
    if result.outcome != StepOutcome.OK:
        await turn.flush()
        raise CompactionFailed(f"all {result.attempts} providers failed")
    if result.truncated:
        await turn.flush()
        raise CompactionFailed(f"summary truncated: {result.truncated}")
    summary = runner_message_content(result.message_json)
    if not any(
        isinstance(block, dict) and block.get("type") == "text" and str(block.get("text", "")).strip()
        for block in summary
    ):
        await turn.flush()
        raise CompactionFailed("empty summary")
    usage = turn.last_usage
    views = await turn.emit_compaction(
        preamble={"role": "user", "content": [{"type": "text", "text": PREAMBLE_TEXT}], "synthetic": "compaction_preamble"},
        summary={"role": "assistant", "content": summary},
        completed={
            "compacted_message_count": compacted_message_count,
            "input_tokens": usage.input_tokens if usage else None,
            "summary_tokens": usage.output_tokens if usage else None,
        },
    )
    turn.live.compaction_backoff = None
    return views[-1]


def runner_message_content(message_json: str) -> list[Any]:
    content = json.loads(message_json).get("content")
    return content if isinstance(content, list) else []
