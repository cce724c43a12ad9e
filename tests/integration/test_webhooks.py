"""Webhooks through the gateway, on the service processes: CRUD and the secret shown once, URLs refused
for their addresses, a turn's events delivered by event type and profile, a receiver down then up, 410,
rotation, the delivery log and retry, and a kill -9 of the session service with deliveries pending.

The receiver is an http.server thread on loopback; `[webhooks] allow_hosts` allows its IP (127.0.0.1)
and nothing else, so `localhost`, the same address by name, stays refused. Signatures are verified with
the `standardwebhooks` package, as a receiver would."""

from __future__ import annotations

import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator

import pytest
from standardwebhooks import Webhook

from testkit.live import new_session, register, result, send
from testkit.mockllm import MockLLM, Reply
from testkit.stack import RunningStack, launch_stack, mock_provider_toml, with_test_limits
from tests.integration.test_ctl import baectl, fails, field, ok

pytestmark = pytest.mark.stack

TOKEN = "sk-test-secret-token-123456"
WAIT = 30.0


class Receiver:
    """Records every POST by path; answers each path's queued statuses in order, then 204."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[str, list[tuple[dict[str, str], bytes]]] = {}
        self.answers: dict[str, list[int]] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver.lock:
                    receiver.requests.setdefault(self.path, []).append((dict(self.headers.items()), body))
                    queued = receiver.answers.get(self.path)
                    status = queued.pop(0) if queued else 204
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self._paths = 0

    def path(self, *answers: int) -> str:
        """A new path of its own, answering `answers` first."""
        with self.lock:
            self._paths += 1
            path = f"/hook/{self._paths}"
            self.answers[path] = list(answers)
        return path

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def got(self, path: str) -> list[tuple[dict[str, str], bytes]]:
        with self.lock:
            return list(self.requests.get(path, []))

    def refuse(self, path: str, statuses: list[int]) -> None:
        with self.lock:
            self.answers[path] = statuses

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_for(check: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, mock: MockLLM) -> Iterator[RunningStack]:
    tmp = tmp_path_factory.mktemp("webhooks")
    config = mock_provider_toml(mock.base_url) + '[webhooks]\nallow_hosts = ["127.0.0.1"]\n'
    # Retry waits of 5 s, 10 s, ... become 50 ms, 100 ms, ...
    running = launch_stack(tmp, config, MOCK_LLM_TOKEN=TOKEN, BAE_WEBHOOK_BACKOFF_SCALE="0.01")
    yield running
    running.close()


@pytest.fixture
def stack(shared: RunningStack, mock: MockLLM) -> Iterator[RunningStack]:
    mock.reset()
    yield shared
    # Each test's webhooks go, so none of them receives another test's events.
    for hook in shared.admin.get("/admin/v1/webhooks", params={"limit": 200}).json()["items"]:
        shared.admin.delete(f"/admin/v1/webhooks/{hook['id']}")


def create(stack: RunningStack, url: str, event_types: list[str], **fields) -> dict:
    created = stack.admin.post("/admin/v1/webhooks", json={"url": url, "event_types": event_types, **fields})
    assert created.status_code == 201, created.text
    return created.json()


def turn(stack: RunningStack, mock: MockLLM, **profile) -> tuple[str, str, dict]:
    """A session on a new profile that took one turn; returns (session id, session key, profile)."""
    sid, skey, profile_row = new_session(stack, **profile)
    register(stack, sid, skey)
    mock.enqueue(Reply.text("hello"))
    assert result(send(stack, sid, skey, "hi"))["events"]
    return sid, skey, profile_row


def session_events(stack: RunningStack, sid: str) -> list[dict]:
    return stack.admin.get(f"/admin/v1/sessions/{sid}/events", params={"limit": 200}).json()["items"]


def deliveries(stack: RunningStack, webhook_id: str) -> list[dict]:
    listed = stack.admin.get(f"/admin/v1/webhooks/{webhook_id}/deliveries", params={"limit": 200})
    assert listed.status_code == 200, listed.text
    return listed.json()["items"]


def verified(secret: str, requests: list[tuple[dict[str, str], bytes]]) -> list[dict]:
    return [Webhook(secret).verify(body, headers) for headers, body in requests]


def test_crud_and_the_secret_shown_once(stack, receiver):
    created = create(stack, receiver.url(receiver.path()), ["server.message.send", "session.close"])
    assert created["id"].startswith("wh_") and created["secret"].startswith("whsec_")
    assert (created["enabled"], created["profile_id"]) == (True, None)
    hook_id = created["id"]
    shown = stack.admin.get(f"/admin/v1/webhooks/{hook_id}")
    assert shown.status_code == 200 and "secret" not in shown.json()
    assert created["secret"] not in shown.text
    assert shown.json() == {key: value for key, value in created.items() if key != "secret"}
    listed = stack.admin.get("/admin/v1/webhooks").json()
    assert [item["id"] for item in listed["items"]] == [hook_id] and listed["next_cursor"] is None
    replaced = stack.admin.put(f"/admin/v1/webhooks/{hook_id}",
                               json={"url": created["url"], "event_types": ["*"], "enabled": False})
    assert replaced.status_code == 200, replaced.text
    assert (replaced.json()["event_types"], replaced.json()["enabled"]) == (["*"], False)
    assert stack.admin.delete(f"/admin/v1/webhooks/{hook_id}").status_code == 204
    for gone in (stack.admin.get(f"/admin/v1/webhooks/{hook_id}"), stack.admin.delete(f"/admin/v1/webhooks/{hook_id}"),
                 stack.admin.get(f"/admin/v1/webhooks/{hook_id}/deliveries")):
        assert (gone.status_code, gone.json()["detail"]) == (404, f"no webhook {hook_id}")


@pytest.mark.parametrize("body,status,kind,detail", [
    ({"event_types": ["*"]}, 400, "bad_request", "missing field `url`"),
    ({"url": "", "event_types": ["*"]}, 400, "bad_request", "url must not be empty"),
    ({"url": "ftp://127.0.0.1/", "event_types": ["*"]}, 400, "bad_request", "http:// or https://"),
    ({"url": "http://u:p@127.0.0.1/", "event_types": ["*"]}, 400, "bad_request", "credentials"),
    ({"url": "http://127.0.0.1/" + "a" * 2100, "event_types": ["*"]}, 400, "bad_request", "at most 2048"),
    ({"url": "http://127.0.0.1/", "event_types": []}, 400, "bad_request", "1 to 64 event types"),
    ({"url": "http://127.0.0.1/", "event_types": [f"t.e{n}" for n in range(65)]}, 400, "bad_request", "1 to 64"),
    ({"url": "http://127.0.0.1/", "event_types": ["Not A Type"]}, 400, "bad_request", "is not an event type"),
    ({"url": "http://127.0.0.1/", "event_types": "*"}, 400, "bad_request", "event_types must be an array"),
    ({"url": "http://127.0.0.1/", "event_types": ["*"], "profile_id": "pro_nope"}, 422, "profile_unavailable",
     "no active profile pro_nope"),
    # Internal addresses outside allow_hosts: a private IP, the metadata address, and the receiver's own
    # loopback address by a name (allow_hosts lists the IP literal only).
    ({"url": "http://10.0.0.1/hook", "event_types": ["*"]}, 400, "webhook_url_refused", "10.0.0.1, a private address"),
    ({"url": "http://169.254.169.254/latest", "event_types": ["*"]}, 400, "webhook_url_refused", "link-local"),
    ({"url": "http://localhost:9/hook", "event_types": ["*"]}, 400, "webhook_url_refused", "loopback address"),
])
def test_bad_bodies_and_internal_urls_are_refused(stack, body, status, kind, detail):
    refused = stack.admin.post("/admin/v1/webhooks", json=body)
    assert (refused.status_code, refused.json()["type"]) == (status, kind), refused.text
    assert detail in refused.json()["detail"]


def test_a_turns_events_are_delivered_by_event_type_and_profile(stack, mock, receiver):
    sid, skey, profile = turn(stack, mock)  # a profile to filter on
    every_path, messages_path, other_path = receiver.path(), receiver.path(), receiver.path()
    every = create(stack, receiver.url(every_path), ["*"], profile_id=profile["id"])
    messages = create(stack, receiver.url(messages_path), ["server.message.send", "client.message.send"])
    create(stack, receiver.url(other_path), ["*"], profile_id=stack.create_profile(f"o{time.monotonic_ns()}")["id"])
    mock.enqueue(Reply.text("second answer"))
    assert result(send(stack, sid, skey, "again"))["events"]
    stack.client.delete(f"/api/v1/sessions/{sid}", headers={"Authorization": f"Bearer {skey}"})
    stored = session_events(stack, sid)
    after = [event for event in stored if event["created_at"] >= every["created_at"]]
    wait_for(lambda: len(receiver.got(every_path)) >= len(after), "every event of the second turn and the close")
    got = verified(every["secret"], receiver.got(every_path))
    by_id = {event["id"]: event for event in stored}
    # Several attempts run at once per webhook, so deliveries may arrive out of order.
    assert sorted(body["data"]["id"] for body in got) == sorted(event["id"] for event in after)
    for body in got:
        assert body == {"type": by_id[body["data"]["id"]]["event_type"], "timestamp": body["data"]["created_at"],
                        "data": by_id[body["data"]["id"]]}
    wanted = [event["id"] for event in after if event["event_type"] in ("server.message.send", "client.message.send")]
    wait_for(lambda: len(receiver.got(messages_path)) >= len(wanted), "the messages")
    assert sorted(body["data"]["id"] for body in verified(messages["secret"], receiver.got(messages_path))) == \
        sorted(wanted)
    assert receiver.got(other_path) == []  # another profile's sessions only
    assert all(d["state"] == "delivered" and d["attempts"] == 1 and d["last_status"] == 204
               for d in deliveries(stack, every["id"]))


def test_a_receiver_down_then_up_gets_every_event_with_one_webhook_id_each(stack, mock, receiver):
    path = receiver.path(503, 503, 500, 502)
    hook = create(stack, receiver.url(path), ["client.message.send", "server.message.send"])
    sid, _, _ = turn(stack, mock)
    wanted = [e["id"] for e in session_events(stack, sid) if e["event_type"] in hook["event_types"]]
    wait_for(lambda: {d["event_id"] for d in deliveries(stack, hook["id"]) if d["state"] == "delivered"} == set(wanted),
             "every delivery, after the refusals")
    requests = receiver.got(path)
    assert len(requests) == len(wanted) + 4
    ids_by_event: dict[str, set[str]] = {}
    for body in verified(hook["secret"], requests):
        ids_by_event.setdefault(body["data"]["id"], set())
    for headers, body in requests:
        ids_by_event[json.loads(body)["data"]["id"]].add(headers["webhook-id"])
    assert sorted(ids_by_event) == sorted(wanted)
    assert all(len(ids) == 1 for ids in ids_by_event.values())  # the same webhook-id across attempts
    assert sum(d["attempts"] for d in deliveries(stack, hook["id"])) == len(wanted) + 4


def test_410_disables_the_webhook(stack, mock, receiver):
    path = receiver.path(410)
    hook = create(stack, receiver.url(path), ["client.message.send"])
    turn(stack, mock)
    wait_for(lambda: not stack.admin.get(f"/admin/v1/webhooks/{hook['id']}").json()["enabled"], "the webhook disabled")
    (delivery,) = deliveries(stack, hook["id"])
    assert (delivery["state"], delivery["last_status"], delivery["next_attempt_at"]) == ("failed", 410, None)
    turn(stack, mock)  # a disabled webhook queues nothing
    time.sleep(1)
    assert len(receiver.got(path)) == 1 and len(deliveries(stack, hook["id"])) == 1


def test_rotation_signs_with_both_secrets(stack, mock, receiver):
    path = receiver.path()
    hook = create(stack, receiver.url(path), ["client.message.send"])
    rotated = stack.admin.post(f"/admin/v1/webhooks/{hook['id']}/rotate-secret")
    assert rotated.status_code == 200, rotated.text
    assert rotated.json()["secret"] != hook["secret"] and rotated.json()["secret"].startswith("whsec_")
    assert rotated.json()["previous_expires_at"] > hook["created_at"]
    assert rotated.json()["secret"] not in stack.admin.get(f"/admin/v1/webhooks/{hook['id']}").text
    turn(stack, mock)
    wait_for(lambda: len(receiver.got(path)) == 1, "the delivery")
    (headers, body), = receiver.got(path)
    assert headers["webhook-signature"].count("v1,") == 2
    for secret in (hook["secret"], rotated.json()["secret"]):
        assert Webhook(secret).verify(body, headers)["type"] == "client.message.send"
    missing = stack.admin.post("/admin/v1/webhooks/wh_nope/rotate-secret")
    assert (missing.status_code, missing.json()["detail"]) == (404, "no webhook wh_nope")


def test_the_delivery_log_and_a_retry(stack, mock, receiver):
    path = receiver.path()
    hook = create(stack, receiver.url(path), ["client.message.send"])
    turn(stack, mock)
    wait_for(lambda: len(receiver.got(path)) == 1, "the delivery")
    wait_for(lambda: deliveries(stack, hook["id"])[0]["state"] == "delivered", "the log to say so")
    (delivery,) = deliveries(stack, hook["id"])
    assert delivery["id"].startswith("msg_") and delivery["webhook_id"] == hook["id"]
    assert (delivery["attempts"], delivery["last_status"], delivery["next_attempt_at"]) == (1, 204, None)
    assert delivery["delivered_at"] is not None
    retried = stack.admin.post(f"/admin/v1/webhooks/{hook['id']}/deliveries/{delivery['id']}/retry")
    assert retried.status_code == 200, retried.text
    assert retried.json()["state"] == "pending" and retried.json()["next_attempt_at"] is not None
    wait_for(lambda: len(receiver.got(path)) == 2, "the delivery sent again")
    first, second = receiver.got(path)
    assert first[0]["webhook-id"] == second[0]["webhook-id"] == delivery["id"] and first[1] == second[1]
    wait_for(lambda: deliveries(stack, hook["id"])[0]["attempts"] == 2, "the second attempt logged")
    missing = stack.admin.post(f"/admin/v1/webhooks/{hook['id']}/deliveries/msg_nope/retry")
    assert (missing.status_code, missing.json()["detail"]) == (404, f"no delivery msg_nope of webhook {hook['id']}")
    bad_page = stack.admin.get(f"/admin/v1/webhooks/{hook['id']}/deliveries", params={"limit": "0"})
    assert bad_page.status_code == 400


def test_baectl_webhook_verbs(stack, mock, receiver):
    path = receiver.path()
    created = baectl(stack, "create", "webhook", receiver.url(path), "--event-type", "client.message.send")
    hook_id, secret = field(ok(created), "id"), field(created.stdout, "secret")
    assert secret.startswith("whsec_") and "copy the secret now" in created.stderr
    listed = ok(baectl(stack, "list", "webhooks"))
    assert listed.splitlines()[0].split() == ["ID", "URL", "EVENT_TYPES", "PROFILE_ID", "ENABLED"]
    assert hook_id in listed
    shown = json.loads(ok(baectl(stack, "get", "webhook", hook_id, "--json")))
    assert shown["event_types"] == ["client.message.send"] and "secret" not in shown
    turn(stack, mock)
    wait_for(lambda: len(receiver.got(path)) == 1, "the delivery")
    wait_for(lambda: deliveries(stack, hook_id)[0]["state"] == "delivered", "the log to say so")
    log = ok(baectl(stack, "deliveries", hook_id))
    assert log.splitlines()[0].split()[:4] == ["ID", "EVENT_TYPE", "STATE", "ATTEMPTS"] and "delivered" in log
    rotated = ok(baectl(stack, "rotate-secret", hook_id))
    assert field(rotated, "secret") not in (secret, "-")
    updated = json.loads(ok(baectl(stack, "update", "webhook", hook_id, receiver.url(path), "--disabled", "--json")))
    assert (updated["enabled"], updated["event_types"]) == (False, ["*"])
    assert ok(baectl(stack, "delete", "webhook", hook_id)).strip() == f"deleted webhook {hook_id}"
    assert fails(baectl(stack, "get", "webhook", hook_id)) == f"no webhook {hook_id}"
    assert "a private address" in fails(baectl(stack, "create", "webhook", "http://10.0.0.1/x"))


def test_kill_9_of_the_session_service_with_deliveries_pending_loses_none(stack, mock, receiver):
    path = receiver.path(*[503] * 1000)
    hook = create(stack, receiver.url(path), ["*"])
    sids = [turn(stack, mock)[0] for _ in range(3)]
    wanted = {event["id"] for sid in sids for event in session_events(stack, sid)}
    wait_for(lambda: len(receiver.got(path)) >= len(wanted), "an attempt of each, refused")
    stack.stack.restart("session", sig=signal.SIGKILL)
    receiver.refuse(path, [])  # the receiver is back
    wait_for(lambda: {d["event_id"] for d in deliveries(stack, hook["id"]) if d["state"] == "delivered"} == wanted,
             "every delivery after the restart", timeout=90)
    delivered = {body["data"]["id"] for body in verified(hook["secret"], receiver.got(path))}
    assert delivered == wanted
    assert len(deliveries(stack, hook["id"])) == len(wanted)  # nothing invented


def test_an_address_no_longer_allowed_is_refused_at_delivery(start_stack, mock, receiver):
    """The delivery-time check, end to end: the webhook was created while its host was allowed; the
    session service then starts again with a config that no longer allows it (as when a name comes to
    resolve to an internal address: the check at delivery is the same), and its pending deliveries are
    refused there, never sent. (tests/unit/test_webhook_delivery.py changes what a name resolves to.)"""
    allowed = mock_provider_toml(mock.base_url) + '[webhooks]\nallow_hosts = ["127.0.0.1"]\n'
    running = start_stack(allowed, MOCK_LLM_TOKEN=TOKEN, BAE_WEBHOOK_BACKOFF_SCALE="0.01")
    path = receiver.path(*[503] * 1000)
    hook = create(running, receiver.url(path), ["client.message.send"])
    turn(running, mock)
    wait_for(lambda: len(receiver.got(path)) >= 1, "a first attempt, refused by the receiver")
    # No [webhooks] table: nothing internal is allowed.
    (running.tmp / "bae-config.toml").write_text(with_test_limits(mock_provider_toml(mock.base_url)))
    running.stack.restart("session")
    receiver.refuse(path, [])
    sent = len(receiver.got(path))
    wait_for(lambda: (deliveries(running, hook["id"])[0]["last_error"] or "").startswith("refused: "),
             "an attempt refused for its address")
    (delivery,) = deliveries(running, hook["id"])
    assert "127.0.0.1, a loopback address" in delivery["last_error"] and delivery["last_status"] is None
    assert delivery["state"] == "pending"  # retried on the schedule: the config may allow it again
    assert len(receiver.got(path)) == sent
