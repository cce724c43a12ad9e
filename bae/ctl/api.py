"""The admin API as baectl reaches it: address forms, token sources, error messages (BAECTL.md §2, §5)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Iterator, Mapping

import httpx

DEFAULT_ADDR = "127.0.0.1:8081"
DEFAULT_KEY_FILE = "/var/lib/bae/admin-key.pem"
TIMEOUT = 30.0

UNEXPECTED = "unexpected response from admin API — check that baectl and the server are the same version"
NO_DETAIL = "the admin API returned an error with no detail"
UNAUTHORIZED = f"""\
admin API rejected the request: no valid admin token was supplied (401 unauthorized).
Provide an admin token in one of these ways (highest precedence first):
  1. --admin-token <token>   (or the BAE_ADMIN_TOKEN env var)
  2. --admin-key-file <path> (or the BAE_ADMIN_KEY_FILE env var)
  3. the default key file at {DEFAULT_KEY_FILE}, which the session service
     writes when it first starts — found automatically when baectl runs where
     the session service does (on its machine, or in its container with
     `docker exec <container> baectl …`)."""
PROFILE_IN_USE_HINT = (
    "Revoke the profile's active keys first: run `baectl list keys` to find them, "
    "then `baectl delete key <id>` for each, and retry the delete."
)


class CtlError(Exception):
    """A runtime failure: printed as `baectl: <message>`, exit 1."""


def base_url(address: str) -> str:
    """`scheme://…` is used as given (trailing `/` removed); anything else is `http://<address>`."""
    return address.rstrip("/") if "://" in address else f"http://{address}"


def admin_address(flag: str | None, env: Mapping[str, str]) -> str:
    """--admin-addr, else BAE_ADMIN_ADDR (an empty value counts as unset), else the default."""
    if flag is not None:
        return flag
    return env.get("BAE_ADMIN_ADDR") or DEFAULT_ADDR


def _read_key(path: str) -> str:
    with open(path, encoding="utf-8") as key_file:
        return key_file.read().strip()


def admin_token(flag_token: str | None, flag_key_file: str | None, env: Mapping[str, str]) -> str | None:
    """The first token source that applies (BAECTL.md §2); None sends no Authorization header."""
    if flag_token is not None:
        return flag_token
    if env.get("BAE_ADMIN_TOKEN"):
        return env["BAE_ADMIN_TOKEN"]
    named = flag_key_file if flag_key_file is not None else env.get("BAE_ADMIN_KEY_FILE")
    if named is not None:
        try:
            return _read_key(named)
        except OSError as exc:
            raise CtlError(f"could not read admin key file {named}: {exc.strerror or exc}") from None
    try:
        return _read_key(DEFAULT_KEY_FILE)
    except (OSError, UnicodeDecodeError):
        return None  # any failure to read the default file means "no token"


def problem_message(status: int, body: bytes) -> str:
    """The message for a non-2xx answer."""
    try:
        problem = json.loads(body)
    except ValueError:
        problem = None
    if not isinstance(problem, dict):
        return f"admin API returned HTTP {status} with an unrecognized body"
    kind = problem.get("type")
    detail = problem.get("detail")
    detail = detail if isinstance(detail, str) and detail.strip() else NO_DETAIL
    if kind == "unauthorized":
        return UNAUTHORIZED
    if kind == "profile_in_use":
        return f"{detail}\n{PROFILE_IN_USE_HINT}"
    if kind == "profile_unavailable":
        return f"{detail} (the referenced profile does not exist or was deleted)"
    return detail


# An export or an import may take long: no bound on the whole, only on each read and write.
STREAM_TIMEOUT = httpx.Timeout(60.0)


def _chunks(body: BinaryIO) -> Iterator[bytes]:
    while chunk := body.read(64 * 1024):
        yield chunk


@dataclass
class AdminApi:
    address: str  # as the user gave it, for messages
    token: str | None

    def __post_init__(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token is not None else {}
        self.http = httpx.Client(headers=headers, timeout=TIMEOUT)
        self.base = base_url(self.address)

    @classmethod
    def from_options(cls, addr: str | None, token: str | None, key_file: str | None,
                     env: Mapping[str, str] = os.environ) -> AdminApi:
        return cls(admin_address(addr, env), admin_token(token, key_file, env))

    def close(self) -> None:
        self.http.close()

    def call(self, method: str, path: str, *, body: Any = None, params: dict[str, str] | None = None,
             expect_body: bool = True) -> Any:
        """The parsed 2xx body (None when there is none and none is expected)."""
        url = f"{self.base}/admin/v1{path}"
        return self._answer(self._send(lambda: self.http.request(method, url, json=body, params=params)), expect_body)

    def _send(self, request: Callable[[], httpx.Response]) -> httpx.Response:
        try:
            return request()
        except (httpx.HTTPError, httpx.InvalidURL, ValueError):
            raise CtlError(
                f"could not connect to admin API at {self.address} — is the BAE server running and is --admin-addr correct?"
            ) from None

    @staticmethod
    def _answer(response: httpx.Response, expect_body: bool) -> Any:
        if not response.is_success:
            raise CtlError(problem_message(response.status_code, response.content))
        if response.status_code == 204 or not response.content.strip():
            if expect_body:
                raise CtlError(UNEXPECTED)
            return None
        try:
            return response.json()
        except ValueError:
            raise CtlError(UNEXPECTED) from None

    def stream_to(self, path: str, out: BinaryIO) -> None:
        """GET `path` and copy its body to `out` as it arrives (an export)."""
        try:
            with self.http.stream("GET", f"{self.base}/admin/v1{path}", timeout=STREAM_TIMEOUT) as response:
                if not response.is_success:
                    raise CtlError(problem_message(response.status_code, response.read()))
                for chunk in response.iter_bytes():
                    out.write(chunk)
        except (httpx.HTTPError, httpx.InvalidURL, ValueError):
            raise CtlError(f"could not read the answer from the admin API at {self.address}") from None

    def upload(self, path: str, body: BinaryIO, media_type: str) -> Any:
        """POST `body` (a file, sent as it is read) and answer the parsed 2xx body."""
        url = f"{self.base}/admin/v1{path}"
        return self._answer(self._send(lambda: self.http.post(
            url, content=_chunks(body), timeout=STREAM_TIMEOUT, headers={"Content-Type": media_type})), True)

    def page(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        """One list page; its `items` must be an array."""
        page = self.call("GET", path, params=params)
        if not isinstance(page, dict) or not isinstance(page.get("items"), list):
            raise CtlError(UNEXPECTED)
        return page

    def every_item(self, path: str, params: dict[str, str] | None = None) -> list[Any]:
        """Every page, following next_cursor; the server's default page size applies."""
        items: list[Any] = []
        query = dict(params or {})
        while True:
            page = self.page(path, query)
            items.extend(page["items"])
            cursor = page.get("next_cursor")
            if not isinstance(cursor, str):
                return items
            query = {**(params or {}), "cursor": cursor}
