"""Webhooks in this process: the retry schedule, the address checks, signatures as a Standard Webhooks
receiver verifies them, the outbox written with the events, and the deliverer against a fake transport."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from sqlalchemy import text
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from bae.common.config import load_config
from bae.common.errors import UsageError
from bae.common.settings import load_settings
from bae.common.webhooks import (
    MAX_URL_CHARS, RefusedAddress, Target, WebhookConfigError, WebhookSettings, check_addresses, internal_reason,
    new_secret, parse_url, read_webhooks, retry_delay, schedule, signature_header,
)
from bae.services.session.engine.ports import WebhookAnswer
from bae.services.session.engine.webhook_delivery import WebhookDeliverer
from bae.services.session.store import Store, events, sessions, webhooks
from testkit.postgres_support import STORES, store_url  # noqa: F401 - the fixture


HOLDER = "127.0.0.1:50051"  # a replica id


def any_room(webhook_id: str) -> int:
    return 100


@pytest.mark.unit
def test_retry_schedule_doubles_up_to_an_hour_within_the_max_age() -> None:
    assert [retry_delay(n) for n in (1, 2, 3, 4)] == [5, 10, 20, 40]
    assert retry_delay(30) == 3600
    assert retry_delay(3, scale=0.01) == pytest.approx(0.2)
    times = schedule(86400)
    assert times[:4] == [5, 15, 35, 75]
    assert times[-1] <= 86400 and len(times) == 32  # 10 doublings to the hour, then hourly
    assert schedule(4) == []


@pytest.mark.parametrize("address,reason", [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("10.1.2.3", "private"), ("192.168.0.1", "private"),
    ("172.16.0.1", "private"), ("169.254.169.254", "link-local (cloud metadata)"), ("fe80::1", "link-local (cloud metadata)"),
    ("::ffff:127.0.0.1", "loopback"), ("0.0.0.0", "unspecified"), ("224.0.0.1", "multicast"),
    ("fd00::1", "private"), ("100.64.0.1", "not globally routable"),
])
@pytest.mark.unit
def test_internal_addresses(address: str, reason: str) -> None:
    assert internal_reason(address) == reason


@pytest.mark.unit
def test_public_addresses_pass() -> None:
    assert internal_reason("93.184.216.34") is None
    assert internal_reason("2606:2800:220:1:248:1893:25c8:1946") is None


@pytest.mark.unit
def test_every_resolved_address_is_checked_unless_the_host_is_allowed() -> None:
    target = Target("https", "hooks.example.com", 443)
    check_addresses(target, ["93.184.216.34"], WebhookSettings())
    with pytest.raises(RefusedAddress, match="resolves to 10.0.0.5, a private address"):
        check_addresses(target, ["93.184.216.34", "10.0.0.5"], WebhookSettings())
    with pytest.raises(RefusedAddress, match="does not resolve"):
        check_addresses(target, [], WebhookSettings())
    check_addresses(target, ["10.0.0.5"], WebhookSettings(frozenset({"hooks.example.com"})))
    # Allowing an IP allows that literal only, not a name that happens to resolve to it.
    allowed_ip = WebhookSettings(frozenset({"127.0.0.1"}))
    check_addresses(Target("http", "127.0.0.1", 80), ["127.0.0.1"], allowed_ip)
    with pytest.raises(RefusedAddress, match="loopback"):
        check_addresses(Target("http", "localhost", 80), ["127.0.0.1"], allowed_ip)


@pytest.mark.parametrize("url,why", [
    ("ftp://example.com/", "http:// or https://"), ("https:///x", "http:// or https://"),
    ("https://user:pw@example.com/", "credentials"), ("https://example.com:99999/", "not a valid URL"),
    ("https://example.com/" + "a" * MAX_URL_CHARS, "at most 2048"),
])
@pytest.mark.unit
def test_urls_that_never_pass(url: str, why: str) -> None:
    with pytest.raises(RefusedAddress, match=why):
        parse_url(url)


@pytest.mark.unit
def test_url_targets() -> None:
    assert parse_url("https://Hooks.Example.com/x?y=1") == Target("https", "hooks.example.com", 443)
    assert parse_url("http://[::1]:8080/") == Target("http", "::1", 8080)


@pytest.mark.unit
def test_webhook_settings() -> None:
    defaults = load_settings({})
    assert (defaults.webhook_max_age, defaults.webhook_backoff_scale) == (86400, 1)
    chosen = load_settings({"BAE_WEBHOOK_MAX_AGE": "60", "BAE_WEBHOOK_BACKOFF_SCALE": "0.01"})
    assert (chosen.webhook_max_age, chosen.webhook_backoff_scale) == (60, 0.01)
    for scale in ("0", "2", "x", "nan"):
        with pytest.raises(UsageError, match="BAE_WEBHOOK_BACKOFF_SCALE"):
            load_settings({"BAE_WEBHOOK_BACKOFF_SCALE": scale})
    with pytest.raises(UsageError, match="BAE_WEBHOOK_MAX_AGE"):
        load_settings({"BAE_WEBHOOK_MAX_AGE": "0"})


@pytest.mark.unit
def test_webhooks_table() -> None:
    assert read_webhooks({"allow_hosts": ["Receiver.Local", "[::1]"]}).allow_hosts == {"receiver.local", "::1"}
    with pytest.raises(WebhookConfigError, match="unknown key `allow`"):
        read_webhooks({"allow": []})
    with pytest.raises(WebhookConfigError, match=r"allow_hosts\[1\] must be a host name"):
        read_webhooks({"allow_hosts": ["a", 3]})


@pytest.mark.unit
def test_config_file_reads_the_webhooks_table(tmp_path) -> None:
    path = tmp_path / "bae-config.toml"
    path.write_text('[webhooks]\nallow_hosts = ["127.0.0.1"]\n')
    assert load_config(str(path)).webhooks.allow_hosts == {"127.0.0.1"}
    path.write_text('[webhooks]\nallow_hosts = "127.0.0.1"\n')
    with pytest.raises(UsageError, match="webhooks.allow_hosts must be an array"):
        load_config(str(path))


@pytest.mark.unit
def test_signatures_verify_with_the_standardwebhooks_library_during_a_rotation() -> None:
    old, new = new_secret(), new_secret()
    assert old.startswith("whsec_")
    body = b'{"type":"session.close","timestamp":"2026-07-06T18:26:10.123Z","data":{}}'
    stamp = int(time.time())
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(stamp),
               "webhook-signature": signature_header([new, old], "msg_1", stamp, body)}
    assert headers["webhook-signature"].count("v1,") == 2
    for secret in (old, new):
        assert Webhook(secret).verify(body, headers)["type"] == "session.close"
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(body, headers)


# -- the outbox and the deliverer, on a real store -------------------------------------------------


# The outbox's tests run on SQLite and on PostgreSQL (testkit.postgres_support.STORES).
on_each_store = pytest.mark.parametrize("store_url", STORES, indirect=True)


@pytest.fixture
async def store(store_url):  # noqa: F811 - the fixture
    store = await Store.open(store_url)
    yield store
    await store.close()


async def _session(store: Store, profile_id: str) -> str:
    return await store.write(lambda conn: sessions.create(
        conn, client_key_id="key_a", profile_id=profile_id, state="open", client_version=None,
        client_tools=[], sandbox_tools=[], subagent_tools=[], compaction={"mode": "client", "prompt": None},
    ))


async def _hook(store: Store, event_types: list[str], profile_id: str | None = None, enabled: bool = True):
    return await store.write(webhooks.create, {
        "url": "http://127.0.0.1:9/hook", "event_types": event_types, "profile_id": profile_id, "enabled": enabled,
    })


async def _log(store: Store, webhook_id: str) -> list[webhooks.DeliveryRecord]:
    rows = await store.read(webhooks.deliveries_page, webhook_id, 0, 100)
    assert rows is not None
    return [row for _, row in rows]


@on_each_store
async def test_events_queue_deliveries_by_event_type_and_profile(store) -> None:
    every, _ = await _hook(store, ["*"])
    closes, _ = await _hook(store, ["session.close"])
    other_profile, _ = await _hook(store, ["*"], profile_id="pro_b")
    disabled, _ = await _hook(store, ["*"], enabled=False)
    sid = await _session(store, "pro_a")
    views = await store.append_events(sid, [("key_a", "client.message.send", {"content": "hi"}),
                                            ("key_a", "session.close", {"reason": "client_close"})])
    # Queued with the events: one outbox row each, naming the webhooks it matched; deliveries once expanded.
    assert await _log(store, every.id) == []
    assert await store.read(webhooks.any_due, 0.0)  # the outbox waits, though no delivery is due yet
    assert await store.write(webhooks.expand, 100) == 2
    assert await store.write(webhooks.expand, 100) == 0
    assert [d.event_id for d in await _log(store, every.id)] == [view["id"] for view in views]
    assert [d.event_type for d in await _log(store, closes.id)] == ["session.close"]
    assert await _log(store, other_profile.id) == [] and await _log(store, disabled.id) == []
    due = await store.write(webhooks.claim_due, HOLDER, time.time(), time.time() + 60, 10, any_room)
    body = json.loads(next(d for d in due if d.webhook_id == closes.id).payload)
    assert body == {"type": "session.close", "timestamp": views[1]["created_at"], "data": json.loads(views[1].json)}
    # Claimed: not due again until the claim runs out.
    assert await store.write(webhooks.claim_due, HOLDER, time.time(), time.time() + 60, 10, any_room) == []


@on_each_store
async def test_a_webhook_deleted_before_its_events_are_expanded_gets_no_delivery(store) -> None:
    kept, _ = await _hook(store, ["*"])
    dropped, _ = await _hook(store, ["*"])
    sid = await _session(store, "pro_a")
    await store.append_events(sid, [("key_a", "session.close", {})])
    assert await store.write(webhooks.delete_one, dropped.id)
    due = await _due(store)  # expands first
    assert [d.webhook_id for d in due] == [kept.id]
    assert await store.read(webhooks.deliveries_page, dropped.id, 0, 10) is None


@on_each_store
async def test_a_provider_request_stored_by_reference_is_sent_whole(store) -> None:
    """A request shares its messages with the one before it in the store; its delivery's body holds the
    event exactly as appended (and as the REST API reads it back), made when the delivery is claimed."""
    await _hook(store, ["provider.request"])
    sid = await _session(store, "pro_a")
    history: list[dict] = []
    appended = []
    for turn in range(3):
        history.append({"role": "user", "content": [{"type": "text", "text": f"question {turn}"}]})
        (view,) = await store.append_events(sid, [(None, "provider.request", {"model": "m", "messages": list(history)})])
        appended.append(view)
        history.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {turn}"}]})
    due = await store.write(webhooks.claim_due, HOLDER, time.time(), time.time() + 60, 10, any_room)
    by_event = {json.loads(d.payload)["data"]["id"]: json.loads(d.payload) for d in due}
    assert len(by_event) == 3
    for view in appended:
        assert by_event[view["id"]]["data"] == json.loads(view.json)
    read_back = dict((json.loads(text)["id"], json.loads(text)) for _, text in await store.read(
        events.page_items, sid, 0, 10))
    assert {event_id: body["data"] for event_id, body in by_event.items()} == read_back


@on_each_store
async def test_a_delivery_whose_event_was_deleted_fails_without_a_request(store) -> None:
    hook, _ = await _hook(store, ["*"])
    sid = await _session(store, "pro_a")
    await store.append_events(sid, [("key_a", "session.close", {})])
    await store.write(events.delete_some, sid, 10)
    assert await _due(store) == []
    (logged,) = await _log(store, hook.id)
    assert (logged.state, logged.last_error) == ("failed", webhooks.EVENT_GONE)


@on_each_store
async def test_an_event_that_is_not_written_queues_nothing(store) -> None:
    hook, _ = await _hook(store, ["*"])
    sid = await _session(store, "pro_a")

    def append_then_fail(conn):
        from bae.services.session.store import events
        events.append(conn, sid, [("key_a", "client.message.send", {"content": "hi"})])
        raise RuntimeError("the transaction rolls back")

    with pytest.raises(RuntimeError):
        await store.write(append_then_fail)
    assert not await store.read(webhooks.any_due, time.time() + 100)  # nothing in the outbox either
    assert await _due(store) == [] and await _log(store, hook.id) == []


@on_each_store
async def test_two_replicas_expanding_at_once_make_each_delivery_once(store, store_url) -> None:  # noqa: F811
    await _hook(store, ["*"])
    await _hook(store, ["*"])
    sid = await _session(store, "pro_a")
    for _ in range(20):
        await store.append_events(sid, [("key_a", "session.close", {}) for _ in range(10)])
    other = await Store.open(store_url)
    try:
        taken = await asyncio.gather(*(replica.write(webhooks.expand, 7) for _ in range(15)
                                       for replica in (store, other)))
    finally:
        await other.close()
    assert sum(taken) == 200
    delivered = await store.read(lambda conn: conn.execute(text(
        "SELECT count(*), count(DISTINCT webhook_id || event_id) FROM webhook_deliveries")).one())
    assert tuple(delivered) == (400, 400)


class FakeTransport:
    """Answers each POST with the next status of `answers` (the last one repeats), records what came."""

    def __init__(self, answers: list[int | None], addresses: list[str] | None = None) -> None:
        self.answers = answers
        self.addresses = ["127.0.0.1"] if addresses is None else addresses
        self.posts: list[tuple[str, dict[str, str], bytes]] = []

    async def resolve(self, host: str, port: int) -> list[str]:
        return self.addresses

    async def post(self, url: str, address: str, headers: dict[str, str], body: bytes) -> WebhookAnswer:
        self.posts.append((address, headers, body))
        status = self.answers[min(len(self.posts), len(self.answers)) - 1]
        return WebhookAnswer(status, None if status is not None else "ConnectError: refused")


def _deliverer(store: Store, transport: FakeTransport, allow: set[str] | None = None, max_age: float = 86400):
    settings = WebhookSettings(frozenset({"127.0.0.1"} if allow is None else allow))
    return WebhookDeliverer(store, transport, settings, holder=HOLDER, max_age=max_age, backoff_scale=0.001,
                            poll_interval=0.05)


async def _due(store: Store, at_least: float = 0.0) -> list[webhooks.DueDelivery]:
    return await store.write(webhooks.claim_due, HOLDER, time.time() + at_least, time.time() + 60, 10, any_room)


@on_each_store
async def test_retries_keep_the_webhook_id_until_a_2xx(store) -> None:
    hook, secret = await _hook(store, ["*"])
    sid = await _session(store, "pro_a")
    await store.append_events(sid, [("key_a", "session.close", {})])
    transport = FakeTransport([503, None, 204])
    deliverer = _deliverer(store, transport)
    outcomes = []
    for _ in range(3):
        (delivery,) = await _due(store, at_least=1.0)  # the scaled waits are milliseconds
        outcomes += await deliverer.deliver([delivery])
    assert outcomes == ["retry", "retry", "delivered"]
    assert len({headers["webhook-id"] for _, headers, _ in transport.posts}) == 1
    for _, headers, body in transport.posts:
        Webhook(secret).verify(body, headers)
    (logged,) = await _log(store, hook.id)
    assert (logged.state, logged.attempts, logged.last_status) == ("delivered", 3, 204)


@on_each_store
async def test_410_disables_the_webhook_and_its_other_deliveries_wait(store) -> None:
    hook, _ = await _hook(store, ["*"])
    sid = await _session(store, "pro_a")
    await store.append_events(sid, [("key_a", "session.close", {}), ("key_a", "session.close", {})])
    first, second = await _due(store)
    deliverer = _deliverer(store, FakeTransport([410]))
    assert await deliverer.deliver([first]) == ["gone"]
    current = await store.read(webhooks.get, hook.id)
    assert current is not None and not current.enabled
    await store.write(webhooks.retry, hook.id, second.id, time.time())
    assert not await store.read(webhooks.any_due, time.time() + 100)
    assert await _due(store, at_least=100) == []  # a disabled webhook's rows are not claimed


@on_each_store
async def test_an_address_that_changed_to_an_internal_one_is_refused_at_delivery(store) -> None:
    await _hook(store, ["*"])
    sid = await _session(store, "pro_a")
    await store.append_events(sid, [("key_a", "session.close", {})])
    transport = FakeTransport([204], addresses=["10.0.0.7"])
    (delivery,) = await _due(store)
    assert await _deliverer(store, transport, allow=set()).deliver([delivery]) == ["refused"]
    assert transport.posts == []  # nothing was sent


@on_each_store
async def test_past_the_max_age_a_delivery_fails(store) -> None:
    hook, _ = await _hook(store, ["*"])
    sid = await _session(store, "pro_a")
    await store.append_events(sid, [("key_a", "session.close", {})])
    (delivery,) = await _due(store)
    assert await _deliverer(store, FakeTransport([500]), max_age=0.000001).deliver([delivery]) == ["failed"]
    (logged,) = await _log(store, hook.id)
    assert (logged.state, logged.next_attempt_at, logged.last_status) == ("failed", None, 500)


@on_each_store
async def test_rotation_signs_with_both_secrets_until_the_old_one_expires(store) -> None:
    hook, old = await _hook(store, ["*"])
    new = await store.write(webhooks.rotate_secret, hook.id, time.time())
    sid = await _session(store, "pro_a")
    await store.append_events(sid, [("key_a", "session.close", {})])
    (delivery,) = await _due(store)
    assert delivery.secrets == (new, old)
    assert old not in repr(delivery) and new not in repr(delivery)
    (later,) = await store.write(webhooks.claim_due, HOLDER, time.time() + 100000, time.time() + 100060, 10,
                                      any_room)
    assert later.secrets == (new,)


@pytest.mark.unit
async def test_a_pass_lets_the_turns_running_on_its_replica_go_first(tmp_path) -> None:
    store = await Store.open(f"sqlite:///{tmp_path}/bae.db")
    turns_ended = asyncio.Event()

    class Turns:
        def busy(self) -> bool:
            return not turns_ended.is_set()

        async def quiet(self) -> None:
            await turns_ended.wait()

        async def next_end(self) -> None:
            await asyncio.Event().wait()  # never: the polls find the work

    transport = FakeTransport([204])
    deliverer = WebhookDeliverer(
        store, transport, WebhookSettings(frozenset({"127.0.0.1"})), holder=HOLDER, max_age=86400,
        backoff_scale=0.001, poll_interval=0.02, turns=Turns(),
    )
    try:
        await _hook(store, ["*"])
        await store.append_events(await _session(store, "pro_a"), [("key_a", "session.close", {})])
        deliverer.start()
        await asyncio.sleep(0.2)  # a turn runs: the pass waits (TURNS_FIRST_SECONDS is 0.5)
        assert transport.posts == []
        turns_ended.set()
        async with asyncio.timeout(5):
            while not transport.posts:
                await asyncio.sleep(0.01)
        # A replica that never stops running turns still sends, after TURNS_FIRST_SECONDS.
        turns_ended.clear()
        await store.append_events(await _session(store, "pro_a"), [("key_a", "session.close", {})])
        async with asyncio.timeout(5):
            while len(transport.posts) < 2:
                await asyncio.sleep(0.01)
    finally:
        await deliverer.stop()
        await store.close()


@on_each_store
async def test_a_restarted_replica_sends_again_what_its_previous_process_had_claimed(store) -> None:
    hook, _ = await _hook(store, ["*"])
    sid = await _session(store, "pro_a")
    await store.append_events(sid, [("key_a", "session.close", {})])
    (claimed,) = await _due(store)  # ... and the process died mid-attempt
    assert await store.write(webhooks.release_claims, "10.0.0.2:50051", time.time()) == 0  # another replica's
    assert await store.write(webhooks.release_claims, HOLDER, time.time()) == 1
    (again,) = await _due(store)
    assert again.id == claimed.id


@on_each_store
async def test_the_log_is_pruned_of_finished_deliveries_only(store) -> None:
    hook, _ = await _hook(store, ["*"])
    sid = await _session(store, "pro_a")
    await store.append_events(sid, [("key_a", "session.close", {}), ("key_a", "session.close", {})])
    assert await store.read(webhooks.any_due, time.time())
    first, _ = await _due(store)
    assert not await store.read(webhooks.any_due, time.time())  # both claimed
    await _deliverer(store, FakeTransport([204])).deliver([first])
    assert await store.write(webhooks.prune, "9999-01-01T00:00:00.000Z", 10) == 1  # the delivered one
    assert [d.state for d in await _log(store, hook.id)] == ["pending"]


@on_each_store
async def test_a_busy_webhook_leaves_its_rows_to_the_others(store) -> None:
    slow, _ = await _hook(store, ["*"])
    fast, _ = await _hook(store, ["*"])
    sid = await _session(store, "pro_a")
    await store.append_events(sid, [("key_a", "session.close", {}) for _ in range(3)])
    claimed = await store.write(webhooks.claim_due, HOLDER, time.time(), time.time() + 60, 10,
                                lambda webhook_id: 1 if webhook_id == slow.id else 0)
    assert [d.webhook_id for d in claimed] == [slow.id]  # one of the slow one's three, none of the other's
    assert len(await _due(store)) == 5


# -- the sender, against a receiver thread on loopback ----------------------------------------------


@pytest.fixture
def redirecting_receiver():
    """Answers every POST 302 to /elsewhere; records the Host header and path of each request."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("content-length", "0")))
            seen.append((self.headers["host"], self.path))
            self.send_response(302)
            self.send_header("location", "/elsewhere")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], seen
    server.shutdown()
    server.server_close()


@pytest.mark.unit
async def test_the_sender_connects_to_the_checked_address_and_follows_no_redirect(redirecting_receiver) -> None:
    from bae.services.session.remote.webhook_sender import WebhookSender

    port, seen = redirecting_receiver
    sender = WebhookSender(timeout=5)
    try:
        # The URL names a host that does not resolve: only the pinned address can have been reached.
        answer = await sender.post(f"http://hooks.invalid:{port}/hook", "127.0.0.1", {"webhook-id": "msg_1"}, b"{}")
        assert await sender.resolve("127.0.0.1", port) == ["127.0.0.1"]
        assert await sender.resolve("hooks.invalid", port) == []
    finally:
        await sender.close()
    assert answer == WebhookAnswer(302)
    assert seen == [(f"hooks.invalid:{port}", "/hook")]
