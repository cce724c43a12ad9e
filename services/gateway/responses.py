"""What the gateway's endpoints answer besides pass-through JSON: RFC 7807 problems."""

from __future__ import annotations

from typing import Mapping

from starlette.responses import Response

from bae.common.errors import Problem

JSON = "application/json"


def problem_response(problem: Problem, headers: Mapping[str, str] | None = None) -> Response:
    # The spec shows RFC 7807 bodies as application/json, not application/problem+json.
    if problem.retry_after is not None:
        headers = {**(headers or {}), "retry-after": str(problem.retry_after)}
    return Response(problem.to_json(), problem.status, headers, media_type=JSON)
