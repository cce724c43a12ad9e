"""The console's files as the admin port serves them: the shell page with the proxy prefix put in,
the security headers on every answer, and the files themselves (no inline script, every module a
page imports exists, the first load stays small).

The browser tests (tests/integration/test_console_*.py) drive the same files in Chromium.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from bae.common.internal import InternalPlane

from bae.services.gateway.console.app import console_routes
from bae.services.gateway.console.assets import CSP, STATIC
from bae.services.gateway.router import build_router
from bae.services.gateway.upstream import Upstream

pytestmark = pytest.mark.unit

# The sessions page's first load (document, style sheet, scripts) must stay under 300 KB over the wire.
FIRST_LOAD_BUDGET = 300 * 1024
IMPORT = re.compile(r"""(?:import|from)\s*\(?\s*["'](\.{1,2}/[^"']+)["']""")


def client(prefix: str = "") -> TestClient:
    # Serving files calls no session replica: the upstream's address is never dialled.
    upstream = Upstream(["127.0.0.1:9"], 1.0, InternalPlane("t" * 32, 30))
    return TestClient(build_router({}, console_routes(prefix, upstream)))


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.script_text = ""
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.script_text += data.strip()


def parsed(page: str) -> Tags:
    tags = Tags()
    tags.feed(page)
    return tags


def imports_of(module: Path) -> set[Path]:
    """The modules `module` imports, statically or with import(), resolved to files."""
    return {(module.parent / target).resolve() for target in IMPORT.findall(module.read_text(encoding="utf-8"))}


def test_the_shell_carries_the_prefix_in_its_base_url_and_the_security_headers() -> None:
    answer = client("/ops/bae").get("/console/")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "text/html; charset=utf-8"
    assert answer.headers["content-security-policy"] == CSP
    assert answer.headers["x-frame-options"] == "DENY"
    assert answer.headers["referrer-policy"] == "no-referrer"
    tags = dict(parsed(answer.text).tags)
    assert tags["base"]["href"] == "/ops/bae/console/"
    assert {"name": "bae-prefix", "content": "/ops/bae"} in [attrs for tag, attrs in parsed(answer.text).tags
                                                             if tag == "meta"]


def test_the_console_without_its_slash_is_redirected_under_the_prefix() -> None:
    answer = client("/bae").get("/console", follow_redirects=False)
    assert (answer.status_code, answer.headers["location"]) == (308, "/bae/console/")


def test_files_are_served_with_the_same_headers_and_missing_ones_are_problems() -> None:
    served = client().get("/console/static/js/app.js")
    assert served.status_code == 200
    assert served.headers["content-type"].startswith("text/javascript")
    assert served.headers["content-security-policy"] == CSP
    assert served.headers["x-content-type-options"] == "nosniff"
    missing = client().get("/console/static/js/nothing.js")
    assert missing.status_code == 404
    assert missing.json()["detail"] == "no console file /console/static/js/nothing.js"
    assert client().get("/console/static/../assets.py").status_code == 404
    assert client().post("/console/static/js/app.js").status_code == 405


def test_the_policy_allows_no_inline_script_and_no_other_origin() -> None:
    directives = dict(part.strip().split(" ", 1) for part in CSP.split(";"))
    assert directives["script-src"] == "'self'"
    assert directives["connect-src"] == "'self'"
    assert directives["default-src"] == "'none'"
    assert "unsafe-inline" not in CSP and "http" not in CSP


def test_the_shell_has_no_inline_script_and_names_only_its_own_files() -> None:
    tags = parsed((STATIC / "index.html").read_text(encoding="utf-8"))
    assert tags.script_text == ""
    for tag, attrs in tags.tags:
        assert not any(name.startswith("on") for name in attrs), (tag, attrs)
        assert "style" not in attrs, (tag, attrs)
        for name in ("src", "href"):
            target = attrs.get(name)
            if target and tag != "base" and not target.startswith("#"):
                assert not re.match(r"^[a-z]+:|^//", target), target
                assert (STATIC.parent / target).exists() or (STATIC / target.removeprefix("static/")).exists(), target


def test_every_module_import_resolves_to_a_file() -> None:
    for module in (STATIC / "js").rglob("*.js"):
        for target in imports_of(module):
            assert target.is_file(), f"{module.relative_to(STATIC)} imports {target} which does not exist"


def test_the_sessions_page_first_load_is_within_its_budget() -> None:
    seen: set[Path] = set()
    pending = [STATIC / "js" / "app.js", STATIC / "js" / "pages" / "sessions.js"]
    while pending:
        module = pending.pop()
        if module not in seen:
            seen.add(module)
            pending.extend(imports_of(module))
    files = [STATIC / "index.html", STATIC / "console.css", *seen]
    assert sum(path.stat().st_size for path in files) <= FIRST_LOAD_BUDGET
