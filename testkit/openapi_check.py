"""Every answer the tests' clients get, checked against the port's OpenAPI document: the operation
found by method and path template, then its status, content type and (JSON) body. A mismatch
fails the request that got it."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from jsonschema import Draft202012Validator

from bae.services.gateway import openapi

DOCUMENTS = {"client": json.loads(openapi.CLIENT_DOCUMENT), "admin": json.loads(openapi.ADMIN_DOCUMENT)}
# Answered by the router itself, on any path: no route (404), or not this method (405).
ROUTER_STATUSES = {404, 405}


class OpenApiCheck:
    """An httpx response hook for one port's client."""

    def __init__(self, port: str) -> None:
        self.document = DOCUMENTS[port]
        # A literal path before the templates it also matches, as the gateway's router tries them.
        self.paths = [(re.compile("^" + re.sub(r"\{[^/]+\}", "[^/]+", path) + "$"), item)
                      for path, item in sorted(self.document["paths"].items(), key=lambda entry: "{" in entry[0])]

    def validator(self, schema: dict) -> Draft202012Validator:
        # `#/components/...` references resolve against the wrapper, which carries the components.
        return Draft202012Validator({"allOf": [schema], "components": self.document["components"]})

    def errors(self, schema: dict, value: Any) -> list[str]:
        return [error.message for error in self.validator(schema).iter_errors(value)]

    def __call__(self, response: httpx.Response) -> None:
        method = response.request.method.lower()
        if method == "head":
            return
        operation = next((item.get(method) for pattern, item in self.paths
                          if pattern.match(response.request.url.path)), None)
        status = str(response.status_code)
        where = f"{response.request.method} {response.request.url.path} answered {status}"
        content_type = response.headers.get("content-type", "").split(";")[0]
        if operation is None or (status not in operation["responses"] and response.status_code in ROUTER_STATUSES):
            assert response.status_code in ROUTER_STATUSES, f"{where}: no such operation"
            assert content_type == "application/json", f"{where}: {content_type}"
            problem = json.loads(response.read())
            assert not self.errors({"$ref": "#/components/schemas/Problem"}, problem), (where, problem)
            return
        assert status in operation["responses"], f"{where}: not a documented status"
        content = operation["responses"][status].get("content", {})
        if not content:
            assert content_type == "", f"{where}: a body of {content_type} where none is documented"
            return
        assert content_type in content, f"{where}: {content_type}, documented {list(content)}"
        if content_type == "application/json":
            body = json.loads(response.read())
            errors = self.errors(content[content_type]["schema"], body)
            assert not errors, (where, errors, body)


def frame_errors(frame: dict) -> list[str]:
    """How a JSON-RPC frame departs from the client document's RpcFrame schema."""
    return OpenApiCheck("client").errors({"$ref": "#/components/schemas/RpcFrame"}, frame)
