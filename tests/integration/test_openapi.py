"""/openapi.json on each port: a valid OpenAPI 3.1 document, every served route is in it, every example
validates, and real answers fit it (every stack test's answers are checked too: testkit/openapi_check.py)."""

from __future__ import annotations

import json
from typing import Any, Iterator

import httpx
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from bae.services.gateway import app, openapi
from testkit.routes import served_routes
from testkit.inprocess import launch_inprocess_stack
from testkit.stack import StackClients, mock_provider_toml

pytestmark = pytest.mark.inprocess

DOCUMENTS = {"client": json.loads(openapi.CLIENT_DOCUMENT), "admin": json.loads(openapi.ADMIN_DOCUMENT)}
HTTP_METHODS = {"get", "put", "post", "delete", "patch"}


def documented_routes(document: dict) -> set[tuple[str, str]]:
    return {(path, method) for path, item in document["paths"].items() for method in item if method in HTTP_METHODS}


@pytest.mark.parametrize(("port", "factory"), [("client", app.client_app), ("admin", app.admin_app)])
def test_every_served_route_is_documented(port: str, factory: Any) -> None:
    assert {(path, method.lower()) for path, method in served_routes(factory)} == documented_routes(DOCUMENTS[port])


def validator(document: dict, schema: dict) -> Draft202012Validator:
    # `#/components/...` references resolve against the wrapper, which carries the components.
    return Draft202012Validator({"allOf": [schema], "components": document["components"]})


def media_examples(document: dict) -> Iterator[tuple[str, dict, Any]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            bodies = [operation.get("requestBody", {})] + list(operation["responses"].values())
            for body in bodies:
                for media, content in body.get("content", {}).items():
                    if "example" in content:
                        yield f"{method.upper()} {path} {media}", content["schema"], content["example"]


@pytest.mark.parametrize("port", ["client", "admin"])
def test_every_example_validates(port: str) -> None:
    document = DOCUMENTS[port]
    assert document["openapi"] == "3.1.0"
    for schema in document["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
    checked = 0
    for where, schema, example in media_examples(document):
        errors = [error.message for error in validator(document, schema).iter_errors(example)]
        assert not errors, (where, errors)
        checked += 1
    assert checked > 10


@pytest.mark.parametrize("port", ["client", "admin"])
def test_each_operation_has_an_id_and_errors_are_json_problems(port: str) -> None:
    operations = [operation for item in DOCUMENTS[port]["paths"].values() for operation in item.values()]
    ids = [operation["operationId"] for operation in operations]
    assert len(ids) == len(set(ids))
    for operation in operations:
        for status, response in operation["responses"].items():
            if int(status) >= 400:
                assert list(response["content"]) == ["application/json"], (operation["operationId"], status)


def test_event_types_are_an_enum_and_each_rpc_method_has_its_schemas() -> None:
    schemas = DOCUMENTS["client"]["components"]["schemas"]
    assert "session.compaction.completed" in schemas["Event"]["properties"]["event_type"]["enum"]
    calls = [option["$ref"].rsplit("/", 1)[1] for option in schemas["RpcCall"]["oneOf"]]
    assert len(calls) == 13
    assert {schemas[call]["properties"]["method"]["const"] for call in calls} == {
        "session.registerDriver", "session.sendMessage", "session.compact", "session.subscribe",
        "session.unsubscribe", "session.startRemoteSandbox", "session.stopRemoteSandbox",
        "session.execRemoteSandbox", "session.reportLocalSandbox", "session.reportLocalSubagent",
        "session.cancelSubagent", "session.updateClientTools", "session.cancelTurn"}
    assert "SendMessageResultFrame" in [frame["$ref"].rsplit("/", 1)[1] for frame in schemas["RpcFrame"]["anyOf"]]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackClients]:
    config = mock_provider_toml("http://127.0.0.1:9") + (
        '[[mcp.servers]]\nname = "notes"\ntransport = "http"\nurl = "http://127.0.0.1:9/mcp"\n'
        'headers = { Authorization = "Bearer ${NOTES_TOKEN}" }\n'
        '[[mcp.servers]]\nname = "files"\ntransport = "stdio"\ncommand = "true"\nenv = { HOME = "/tmp" }\n')
    running = launch_inprocess_stack(tmp_path_factory.mktemp("openapi"), config)
    yield running
    running.close()


def fits(port: str, path: str, method: str, response: httpx.Response) -> None:
    """The response's status is documented for the route, and its body fits the documented schema."""
    document = DOCUMENTS[port]
    documented = document["paths"][path][method]["responses"]
    assert str(response.status_code) in documented, (path, response.status_code, response.text)
    content = documented[str(response.status_code)].get("content", {})
    if not content:
        return
    schema = next(iter(content.values()))["schema"]
    errors = [error.message for error in validator(document, schema).iter_errors(response.json())]
    assert not errors, (path, errors, response.text)


def test_served_documents_and_real_answers_fit_them(stack: StackClients) -> None:
    for port, client in (("client", stack.client), ("admin", stack.admin)):
        served = client.get("/openapi.json")
        assert served.status_code == 200 and served.headers["content-type"].startswith("application/json")
        assert served.json() == DOCUMENTS[port]
        validate(served.json())  # raises on an invalid OpenAPI 3.1 document

    admin, client = stack.admin, stack.client
    fits("client", "/api/v1/meta", "get", client.get("/api/v1/meta"))
    created = admin.post("/admin/v1/profiles", json={"name": "fit", "primary_provider": "mock",
                                                     "allowed_tools": ["get_time"],
                                                     "available_sandboxes": ["bae-test-none:x"]})
    fits("admin", "/admin/v1/profiles", "post", created)
    profile_id = created.json()["id"]
    fits("admin", "/admin/v1/profiles", "post", admin.post("/admin/v1/profiles", json={"name": "fit"}))
    fits("admin", "/admin/v1/profiles", "get", admin.get("/admin/v1/profiles"))
    fits("admin", "/admin/v1/profiles/{id}", "get", admin.get(f"/admin/v1/profiles/{profile_id}"))
    fits("admin", "/admin/v1/profiles/{id}", "get", admin.get("/admin/v1/profiles/pro_nope"))
    key = admin.post("/admin/v1/keys", json={"name": "k", "profile_id": profile_id})
    fits("admin", "/admin/v1/keys", "post", key)
    fits("admin", "/admin/v1/keys", "get", admin.get("/admin/v1/keys"))
    for path in ("/admin/v1/providers", "/admin/v1/mcp-servers", "/admin/v1/config", "/admin/v1/sandbox-status"):
        fits("admin", path, "get", admin.get(path))
    fits("admin", "/admin/v1/profiles", "get", httpx.get(f"{stack.admin_url}/admin/v1/profiles"))

    auth = {"Authorization": f"Bearer {key.json()['key']}"}
    opened = client.post("/api/v1/sessions", json={"client_version": "1", "tools": [
        {"name": "get_time", "description": "t", "input_schema": {"type": "object"}}]}, headers=auth)
    fits("client", "/api/v1/sessions", "post", opened)
    session_id, session_auth = opened.json()["session_id"], {"Authorization": f"Bearer {opened.json()['session_key']}"}
    fits("client", "/api/v1/sessions/{id}/join", "post",
         client.post(f"/api/v1/sessions/{session_id}/join", json={}, headers=auth))
    fits("client", "/api/v1/sessions/{id}/events", "get",
         client.get(f"/api/v1/sessions/{session_id}/events", headers=session_auth))
    fits("client", "/api/v1/sessions/{id}/participants", "get",
         client.get(f"/api/v1/sessions/{session_id}/participants", headers=session_auth))
    rpc = client.post(f"/api/v1/sessions/{session_id}/rpc", headers=session_auth,
                      json={"jsonrpc": "2.0", "id": 1, "method": "session.registerDriver"})
    frame_schema = DOCUMENTS["client"]["paths"]["/api/v1/sessions/{id}/rpc"]["post"]["responses"]["200"][
        "content"]["application/x-ndjson"]["schema"]
    for line in rpc.text.splitlines():
        assert not list(validator(DOCUMENTS["client"], frame_schema).iter_errors(json.loads(line)))
    fits("admin", "/admin/v1/sessions", "get", admin.get("/admin/v1/sessions"))
    fits("admin", "/admin/v1/sessions/{id}/events", "get", admin.get(f"/admin/v1/sessions/{session_id}/events"))
    fits("client", "/api/v1/sessions/{id}", "delete", client.delete(f"/api/v1/sessions/{session_id}",
                                                                    headers=session_auth))
    fits("client", "/api/v1/sessions/{id}", "delete", client.delete(f"/api/v1/sessions/{session_id}",
                                                                    headers=session_auth))
