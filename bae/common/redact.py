"""Secrets kept out of events, logs and spans: any run of MIN_SECRET_LENGTH or more characters of one.

A provider may echo part of its key in an error body (`invalid x-api-key sk-ant-api03-AbC…`), an MCP
server part of its header; that text is stored in events clients read, logged, and put on spans.
A service registers the secrets of its config (`register_config`: provider tokens, MCP credential
headers); `redact` replaces every such run in a failure's text with REDACTED before the text goes
anywhere. A shorter run is left alone: it would match ordinary text, and redacting it would corrupt
every body without protecting a real secret. A successful answer, which may be megabytes of the
model's output, is searched for whole secrets only (`redact_whole`, one scan per secret): runs are
what an error message echoes, and searching megabytes for every piece of every secret costs seconds.
"""

from __future__ import annotations

import re
from typing import Iterable

from bae.common.config import REDACTED, Config, EnvResolutionError, resolve_env

MIN_SECRET_LENGTH = 8
# Every run of MIN_SECRET_LENGTH (>= 2 * _GRAM - 1) characters of a secret holds one of its _GRAM-character
# pieces at offsets 0, _GRAM, 2 * _GRAM, …: finding those pieces (str.find, in C) finds every run.
_GRAM = 4
# MCP headers that carry credentials; the rest (Accept, Content-Type) would only match ordinary text.
_CREDENTIAL_HEADER = re.compile(r"auth|token|key|secret|cookie|session|password", re.IGNORECASE)
# An Authorization scheme is no secret: only the credential after it is.
_SCHEME = re.compile(r"^(?:Bearer|Basic|Token|Bot)\s+", re.IGNORECASE)

_Grams = dict[str, list[tuple[str, int]]]


def _grams_of(secrets: Iterable[str]) -> _Grams:
    grams: _Grams = {}
    for secret in secrets:
        for offset in range(0, len(secret) - _GRAM + 1, _GRAM):
            grams.setdefault(secret[offset:offset + _GRAM], []).append((secret, offset))
    return grams


class Secrets:
    """The secrets one process redacts."""

    def __init__(self) -> None:
        self._secrets: set[str] = set()
        self._grams: _Grams = {}

    def add(self, *values: str) -> None:
        fresh = {value for value in values if len(value) >= MIN_SECRET_LENGTH} - self._secrets
        if fresh:
            self._secrets |= fresh
            self._grams = _grams_of(self._secrets)

    def redact(self, text: str, *also: str) -> str:
        """`text` with every run of MIN_SECRET_LENGTH or more characters of a secret (these, and `also`)
        replaced by REDACTED."""
        extra = [value for value in also if len(value) >= MIN_SECRET_LENGTH and value not in self._secrets]
        grams = _grams_of([*self._secrets, *extra]) if extra else self._grams
        if not grams or len(text) < MIN_SECRET_LENGTH:
            return text
        spans: list[tuple[int, int]] = []
        for gram, places in grams.items():
            at = text.find(gram)
            while at != -1:
                for secret, offset in places:
                    start, end = _run(text, at, secret, offset)
                    if end - start >= MIN_SECRET_LENGTH:
                        spans.append((start, end))
                at = text.find(gram, at + 1)
        if not spans:
            return text
        merged: list[list[int]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        parts: list[str] = []
        written = 0
        for start, end in merged:
            parts += [text[written:start], REDACTED]
            written = end
        parts.append(text[written:])
        return "".join(parts)


    def redact_whole(self, text: str, *also: str) -> str:
        """`text` with every whole secret (these, and `also`) replaced by REDACTED."""
        for secret in (*self._secrets, *also):
            if len(secret) >= MIN_SECRET_LENGTH and secret in text:
                text = text.replace(secret, REDACTED)
        return text


def _run(text: str, at: int, secret: str, offset: int) -> tuple[int, int]:
    """The run of `secret`'s characters around `text[at:at + _GRAM]` == `secret[offset:offset + _GRAM]`."""
    start, left = at, offset
    while start > 0 and left > 0 and text[start - 1] == secret[left - 1]:
        start, left = start - 1, left - 1
    end, right = at + _GRAM, offset + _GRAM
    while end < len(text) and right < len(secret) and text[end] == secret[right]:
        end, right = end + 1, right + 1
    return start, end


SECRETS = Secrets()


def redact(text: str, *also: str) -> str:
    """`text` without any run of MIN_SECRET_LENGTH or more characters of this process's secrets or `also`."""
    return SECRETS.redact(text, *also)


def redact_whole(text: str, *also: str) -> str:
    """`text` without any whole secret of this process's or of `also`."""
    return SECRETS.redact_whole(text, *also)


def register_config(config: Config) -> None:
    """The config's secrets, as its `${VAR}` templates resolve here: every provider's auth token and the
    credential of every MCP header that carries one. A template that does not resolve has no secret yet."""
    values = [provider.auth_token for provider in config.providers]
    for server in config.mcp_servers:
        values += [_SCHEME.sub("", value) for name, value in server.headers.items() if _CREDENTIAL_HEADER.search(name)]
    for value in values:
        try:
            SECRETS.add(resolve_env(value))
        except EnvResolutionError:
            pass
