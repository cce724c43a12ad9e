// A session's events, each handed on once: first its history (GET .../events, page by page), then
// live from the admin port's Server-Sent Events route, from the last event of the history on
// (the stream replays only what follows since_event_id), across dropped connections.
//
// The stream has no error frame: it just ends when the session closes, when the server cuts an
// observer that fell behind, or when a gateway or session replica goes away. EventSource would
// reconnect by itself with Last-Event-ID, but without backing off and without knowing that a
// closed session's stream ends for good. So each end closes the EventSource, and this module
// decides: a session that is still open is reopened with since_event_id (the last event seen),
// after a delay that doubles with each failure in a row; one that is not open gets one last
// reopen, which replays whatever was stored after the last event seen (a closed session's stream
// replays, then ends), and then stays ended.

import { api, url } from "./api.js";

const FIRST_DELAY_MS = 500;
const MAX_DELAY_MS = 30_000;
const HISTORY_PAGE = 200;

// onEvent(event): each event once, in order; onDelta(delta, replaces): a provider call's output
// piece (replaces: the first of its block on this connection, the catch-up, which holds the
// block's whole text so far); onState(state, detail): "connecting", "live", "reconnecting"
// (detail: the delay in ms), "ended", "failed" (detail: the error). Returns stop().
export function followSession(sessionId, { onEvent, onDelta, onState }) {
  const seen = new Set();
  let lastEventId = "";
  let source = null;
  let timer = null;
  let failures = 0;
  let finalReplay = false;
  let stopped = false;
  // Content blocks ("<request event id> <index>") that got a delta on the current connection.
  let blocksThisConnection = new Set();

  function handOn(event) {
    lastEventId = event.id;
    if (seen.has(event.id)) return;
    seen.add(event.id);
    onEvent(event);
  }

  // The stored events up to now; a page that fails is asked again, after a delay as the stream's.
  let historyCursor = "";
  async function loadHistory() {
    timer = null;
    onState("connecting");
    try {
      do {
        const query = new URLSearchParams({ limit: String(HISTORY_PAGE) });
        if (historyCursor) query.set("cursor", historyCursor);
        const page = await api(`/admin/v1/sessions/${encodeURIComponent(sessionId)}/events?${query}`);
        if (stopped) return;
        page.items.forEach(handOn);
        historyCursor = page.next_cursor || "";
      } while (historyCursor);
    } catch (error) {
      if (stopped) return;
      if (error.status === 401 || error.status === 404) {
        onState("failed", error);
        return;
      }
      retryLater(loadHistory);
      return;
    }
    open();
  }

  function retryLater(action) {
    const delay = Math.min(MAX_DELAY_MS, FIRST_DELAY_MS * 2 ** failures);
    failures += 1;
    onState("reconnecting", delay);
    timer = setTimeout(action, delay);
  }

  function open() {
    timer = null;
    const query = new URLSearchParams({ deltas: "true" });
    if (lastEventId) query.set("since_event_id", lastEventId);
    blocksThisConnection = new Set();
    onState("connecting");
    source = new EventSource(url(`/admin/v1/sessions/${encodeURIComponent(sessionId)}/events/stream?${query}`));
    source.addEventListener("open", () => {
      failures = 0;
      onState("live");
    });
    source.addEventListener("session.event", (message) => handOn(JSON.parse(message.data)));
    source.addEventListener("session.delta", (message) => {
      const delta = JSON.parse(message.data);
      const block = `${delta.request_event_id} ${delta.index}`;
      const replaces = !blocksThisConnection.has(block);
      blocksThisConnection.add(block);
      onDelta(delta, replaces);
    });
    source.addEventListener("error", ended);
  }

  async function ended() {
    source.close();
    source = null;
    if (stopped) return;
    if (finalReplay) {
      onState("ended");
      return;
    }
    let state;
    try {
      state = (await api(`/admin/v1/sessions/${encodeURIComponent(sessionId)}`)).state;
    } catch (error) {
      // Signed out (401) or the session deleted (404): nothing to reconnect to.
      if (error.status === 401 || error.status === 404) {
        onState("failed", error);
        return;
      }
      state = "unknown"; // the gateway is away: try again, later and later
    }
    if (stopped) return;
    if (state !== "open" && state !== "unknown") {
      finalReplay = true;
      open();
      return;
    }
    retryLater(open);
  }

  loadHistory();
  return function stop() {
    stopped = true;
    if (timer) clearTimeout(timer);
    if (source) source.close();
  };
}
