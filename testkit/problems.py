"""A REST problem answer (RFC 7807) as the tests check it: exactly the spec's four fields."""

from __future__ import annotations

import httpx


def assert_problem(response: httpx.Response, status: int, type_: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "title", "status", "detail"}, body
    assert (body["type"], body["status"]) == (type_, status)
    return body
