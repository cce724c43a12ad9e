// #/sessions/<id>: one session, live. The header is the session's record; below it the session's
// usage, sandboxes and subagents, then its turns, each with a waterfall of its provider calls and
// tool dispatches and its events (each expandable to its JSON). Everything below the header is
// derived from the events of the admin event stream (js/eventstream.js), which also brings the
// provider calls' output as it is written (deltas), shown under the call until its response
// event replaces it.

import { api, allPages } from "../api.js";
import { h, clear, errorBlock, formatTime } from "../dom.js";
import { followSession } from "../eventstream.js";
import { Turns, waterfall, turnStatus, usage, pricesOf, sandboxes, subagents, summary, time } from "../timeline.js";

const STREAM_STATES = {
  connecting: "Connecting to the event stream…",
  live: "Live: new events appear as they happen.",
  reconnecting: "The event stream dropped; reconnecting",
  ended: "The session is over: its stream has ended.",
  failed: "The event stream stopped",
};

export async function render(main, [sessionId]) {
  const route = location.hash;
  const path = `/admin/v1/sessions/${encodeURIComponent(sessionId)}`;
  const [record, providers] = await Promise.all([api(path), api("/admin/v1/providers")]);
  const prices = pricesOf(providers.items);
  const [profile, keys] = await Promise.all([
    api(`/admin/v1/profiles/${encodeURIComponent(record.profile_id)}`).catch(() => null),
    allPages("/admin/v1/keys"),
  ]);
  const keyNames = new Map(keys.map((k) => [k.id, `${k.name} (${k.prefix})`]));

  const facts = h("dl", { class: "facts", id: "session-facts" });
  const streamState = h("p", { id: "stream-state", role: "status" });
  const usageBox = h("dl", { class: "facts", id: "session-usage" });
  const sandboxBox = h("div", { id: "session-sandboxes" });
  const subagentBox = h("div", { id: "session-subagents" });
  const turnsBox = h("div", { id: "turns" });
  main.append(
    h("p", {}, h("a", { href: "#/sessions" }, "← Sessions")),
    h("h1", {}, "Session ", h("span", { class: "mono" }, sessionId)),
    h("section", { class: "card", "aria-label": "Session" }, facts, streamState),
    h(
      "div",
      { class: "panels" },
      h("section", { class: "card", "aria-labelledby": "usage-title" }, h("h2", { id: "usage-title" }, "Usage"), usageBox),
      h("section", { class: "card", "aria-labelledby": "sandboxes-title" }, h("h2", { id: "sandboxes-title" }, "Sandboxes"), sandboxBox),
      h("section", { class: "card", "aria-labelledby": "subagents-title" }, h("h2", { id: "subagents-title" }, "Subagents"), subagentBox),
    ),
    h("h2", {}, "Turns"),
    turnsBox,
  );

  let creatorKeyId = "";
  let shown = record;
  function showRecord(session) {
    shown = session;
    const keyId = session.client_key_id || creatorKeyId;
    clear(facts).append(
      fact("State", h("span", { class: `state state-${session.state}`, id: "session-state" }, session.state)),
      fact("Profile", profile ? `${profile.name} ` : "", h("span", { class: "mono muted" }, session.profile_id)),
      fact("Client key", keyId ? [keyNames.get(keyId) || "", " ", h("span", { class: "mono muted" }, keyId)] : "—"),
      fact("Client version", session.client_version || "—"),
      fact("Created", formatTime(session.created_at)),
      fact("Closed", formatTime(session.closed_at) || "—"),
    );
  }
  showRecord(record);

  const all = [];
  const turns = new Turns();
  const views = new Map(); // group number -> its DOM parts
  const calls = new Map(); // provider.request event id -> the group it belongs to
  let summariesDue = false;

  function viewOf(group) {
    let view = views.get(group.number);
    if (view) return view;
    const title = group.number ? `Turn ${group.number}` : "Opening";
    const status = h("span", { class: "turn-status" });
    const meta = h("span", { class: "muted turn-meta" });
    view = {
      status,
      meta,
      bars: h("ul", { class: "waterfall", "aria-label": `${title}: provider calls and tool dispatches` }),
      live: h("div", { class: "live" }),
      list: h("ol", { class: "events" }),
      blocks: new Map(), // "<request event id> <index>" -> the <pre> its deltas grow
    };
    view.section = h(
      "section",
      { class: "card turn", dataset: { turn: String(group.number) } },
      h("h3", {}, title, " ", status, " ", meta),
      view.bars,
      view.live,
      view.list,
    );
    views.set(group.number, view);
    turnsBox.append(view.section);
    return view;
  }

  function showTurn(group, view) {
    const events = group.events;
    const took = time(events[events.length - 1]) - time(events[0]);
    const spent = usage(events, prices);
    view.status.textContent = group.number ? turnStatus(events) : "";
    view.status.className = `turn-status status-${view.status.textContent.split(/[ :]/)[0]}`;
    view.meta.textContent = `${formatTime(events[0].created_at)}, ${took} ms${spent.calls ? `, ${spent.input} in / ${spent.output} out tokens` : ""}`;
    drawWaterfall(view.bars, waterfall(events));
  }

  function onEvent(event) {
    all.push(event);
    const group = turns.add(event);
    const view = viewOf(group);
    view.list.append(eventRow(event));
    if (event.event_type === "provider.request") calls.set(event.id, group);
    if (event.event_type === "session.open" && event.client_key_id && !creatorKeyId) {
      creatorKeyId = event.client_key_id; // the key that opened the session
      showRecord(shown);
    }
    if (event.event_type === "provider.response") {
      // The call's final answer replaces what its deltas showed.
      for (const box of view.live.querySelectorAll(".live-call")) {
        if (!openCalls(group.events).has(box.dataset.request)) box.remove();
      }
    }
    showTurn(group, view);
    if (event.event_type === "session.close" || event.event_type === "session.error") refreshRecord();
    // A replay brings many events at once: the summaries are drawn once per frame.
    if (!summariesDue) {
      summariesDue = true;
      requestAnimationFrame(() => {
        summariesDue = false;
        showSummaries();
      });
    }
  }

  function onDelta(delta, replaces) {
    const group = calls.get(delta.request_event_id);
    if (!group || !openCalls(group.events).has(delta.request_event_id)) return; // answered already
    const view = viewOf(group);
    if (delta.kind === "reset") {
      // The attempt failed mid-stream: what it streamed is dropped; a fallback call follows.
      for (const box of view.live.querySelectorAll(".live-call")) if (box.dataset.request === delta.request_event_id) box.remove();
      for (const key of [...view.blocks.keys()]) if (key.startsWith(`${delta.request_event_id} `)) view.blocks.delete(key);
      return;
    }
    const key = `${delta.request_event_id} ${delta.index}`;
    let block = view.blocks.get(key);
    if (!block || !block.isConnected) {
      let box = [...view.live.querySelectorAll(".live-call")].find((b) => b.dataset.request === delta.request_event_id);
      if (!box) {
        box = h("div", { class: "live-call", dataset: { request: delta.request_event_id } },
          h("p", { class: "muted" }, "Provider answering…"));
        view.live.append(box);
      }
      block = h("pre", { class: `delta delta-${delta.kind}`, dataset: { index: String(delta.index) } });
      box.append(block);
      view.blocks.set(key, block);
    }
    block.textContent = (replaces ? "" : block.textContent) + delta.text;
  }

  function showSummaries() {
    const spent = usage(all, prices);
    clear(usageBox).append(
      fact("Provider calls", String(spent.calls)),
      fact("Input tokens", String(spent.input)),
      fact("Output tokens", String(spent.output)),
      fact("Cost", ...costOf(spent)),
    );
    const boxes = sandboxes(all);
    clear(sandboxBox).append(
      boxes.length
        ? h("ul", { class: "plain" }, boxes.map((s) => h("li", {}, h("strong", {}, s.image), " ",
            h("span", { class: `state state-${s.state.split(" ")[0]}` }, s.state),
            s.sandbox_id ? h("span", { class: "mono" }, ` ${s.sandbox_id}`) : null,
            s.detail ? h("span", { class: "muted" }, ` ${s.detail}`) : null)))
        : h("p", { class: "muted" }, "None."),
    );
    const agents = subagents(all);
    clear(subagentBox).append(
      agents.length
        ? h("ul", { class: "plain" }, agents.map((a) => h("li", {}, h("span", { class: "mono" }, a.id), ` ${a.harness} `,
            h("span", { class: `state state-${a.state}` }, a.state), a.detail ? h("span", { class: "muted" }, ` ${a.detail}`) : null)))
        : h("p", { class: "muted" }, "None."),
    );
  }

  async function refreshRecord() {
    try {
      showRecord(await api(path));
    } catch {
      // The header keeps what it had; the stream's state line tells what went wrong.
    }
  }

  function onState(state, detail) {
    let text = STREAM_STATES[state];
    if (state === "reconnecting") text += ` in ${(detail / 1000).toFixed(1)} s.`;
    if (state === "failed") text += `: ${detail.message}`;
    streamState.textContent = text;
    streamState.dataset.state = state;
    if (state === "ended") refreshRecord();
  }

  showSummaries();
  // Left while its first answers were awaited: another page is shown, and no stream is started.
  if (location.hash !== route) return null;
  return followSession(sessionId, { onEvent, onDelta, onState });
}

function costOf(spent) {
  const note = (text) => h("span", { class: "muted" }, text);
  if (!spent.calls) return ["—"];
  if (!spent.cost && !spent.priced) return ["—", note(" (the providers that answered have no prices)")];
  return [`${spent.priced ? "" : "at least "}$${spent.cost.toFixed(6)}`, note(" at the registry's current prices")];
}

function fact(label, ...value) {
  return h("div", {}, h("dt", {}, label), h("dd", {}, value));
}

// The provider.request ids among `events` that have no provider.response yet (responses answer
// the calls in order).
function openCalls(events) {
  const open = [];
  for (const event of events) {
    if (event.event_type === "provider.request") open.push(event.id);
    else if (event.event_type === "provider.response") open.shift();
  }
  return new Set(open);
}

function eventRow(event) {
  const details = h(
    "details",
    { class: "event", dataset: { eventId: event.id, eventType: event.event_type } },
    h("summary", {},
      h("time", { datetime: event.created_at }, event.created_at.slice(11, 23)), " ",
      h("span", { class: "event-type" }, event.event_type), " ",
      h("span", { class: "muted" }, summary(event))),
  );
  // The JSON is built when the row is opened: a long session has thousands of rows.
  details.addEventListener("toggle", () => {
    if (details.open && !details.querySelector("pre")) details.append(h("pre", { class: "json" }, JSON.stringify(event, null, 2)));
  });
  return h("li", {}, details);
}

function drawWaterfall(box, { start, end, bars }) {
  clear(box);
  if (!bars.length) return;
  const span = Math.max(end - start, 1);
  for (const bar of bars) {
    const done = bar.end !== null;
    const took = (done ? bar.end : end) - bar.start;
    const block = h("span", { class: `bar bar-${bar.kind}${bar.dispatch ? ` bar-${bar.dispatch}` : ""}${bar.ok ? "" : " bar-error"}${done ? "" : " bar-open"}` });
    // Positions come from the data: set through the CSSOM, which the page's CSP allows.
    block.style.left = `${((bar.start - start) / span) * 100}%`;
    block.style.width = `${Math.max((took / span) * 100, 0.5)}%`;
    box.append(
      h("li", { class: "wf-row", dataset: { kind: bar.kind, id: bar.id } },
        h("span", { class: "wf-label" }, bar.label),
        h("span", { class: "wf-track" }, block),
        h("span", { class: "wf-ms" }, done ? `${took} ms` : "running")),
    );
  }
}
