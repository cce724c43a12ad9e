"""The browser tests' harness (testkit/browser.py): without a browser a test skips with the reason,
except under CI, where it fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit import browser

pytestmark = pytest.mark.unit


def test_a_missing_chromium_skips_with_the_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(browser, "CHROMIUM", tmp_path / "chromium")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"{tmp_path / 'chromium'} is missing \\(apt-get install chromium\\)"):
        browser.require_browser()


def test_under_ci_a_missing_chromium_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(browser, "CHROMIUM", tmp_path / "chromium")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="the browser tests must run in CI"):
        browser.require_browser()
