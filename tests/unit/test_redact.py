"""Secrets out of events, logs and spans: any run of 8 or more characters of one is redacted."""

from __future__ import annotations

import pytest

from bae.common.config import REDACTED, Config, McpServer, ProviderEntry
from bae.common.redact import Secrets, register_config, SECRETS

pytestmark = pytest.mark.unit

KEY = "sk-ant-api03-Zx9Qw2Lm7Rt4Vb8Nc1Hy6Pk3"


@pytest.mark.parametrize("text,redacted", [
    (f'{{"message":"invalid x-api-key {KEY[:20]}"}}', f'{{"message":"invalid x-api-key {REDACTED}"}}'),
    (f"..{KEY[9:17]}..", f"..{REDACTED}.."),  # 8 characters from the middle, on no boundary of 4
    (f"{KEY[9:16]}", KEY[9:16]),  # 7 are ordinary text
    (f"{KEY}{KEY[:10]} and {KEY[-12:]}", f"{REDACTED} and {REDACTED}"),
    ("nothing of it", "nothing of it"),
])
def test_every_run_of_eight_or_more_characters_of_a_secret_is_redacted(text: str, redacted: str) -> None:
    secrets = Secrets()
    secrets.add(KEY, "short")
    assert secrets.redact(text) == redacted
    assert Secrets().redact(text, KEY) == redacted  # a secret given for one call


def test_an_answer_is_searched_for_whole_secrets() -> None:
    secrets = Secrets()
    secrets.add(KEY)
    assert secrets.redact_whole(f"a {KEY} and {KEY[:20]}") == f"a {REDACTED} and {KEY[:20]}"


def test_the_config_secrets_are_its_tokens_and_credential_headers() -> None:
    register_config(Config(
        providers=(ProviderEntry("p", "anthropic", "m", auth_token="tok-Yq8Wd3Jf5Ux1"),),
        mcp_servers=(McpServer("s", "http", url="http://s", headers={
            "Authorization": "Bearer hdr-Kp4Tn7Gs2Ev9", "Accept": "application/json"}),),
    ))
    assert SECRETS.redact("tok-Yq8Wd3Jf5Ux1 hdr-Kp4Tn7Gs2Ev9 Bearer x application/json") == (
        f"{REDACTED} {REDACTED} Bearer x application/json")
