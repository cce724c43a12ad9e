// What the session page shows, derived from a session's events alone (docs/reference/events.md):
// turns, each turn's waterfall of provider calls and tool dispatches, usage and cost, sandbox and
// subagent state, and a one-line summary of each event. No DOM here.

// session.error reasons that move the session to `error`, and so end the turn.
const FATAL_ERRORS = new Set([
  "provider_config", "all_providers_failed", "loop_limit", "profile_unavailable", "tool_result_merge_invalid",
]);

export const time = (event) => Date.parse(event.created_at);

function blocks(content) {
  return Array.isArray(content) ? content : [];
}

// A turn starts at a user message; the one that carries a paused turn's client tool results (only
// tool_result blocks) goes on with that turn.
export function startsTurn(event) {
  if (event.event_type !== "client.message.send") return false;
  const content = event.payload?.content;
  return !(Array.isArray(content) && content.length && content.every((b) => b?.type === "tool_result"));
}

// The events split into groups: the first holds what came before any turn (the session's opening),
// each next one a turn. `add` returns the group an event went to.
export class Turns {
  constructor() {
    this.groups = [{ number: 0, events: [] }];
  }

  add(event) {
    if (startsTurn(event)) this.groups.push({ number: this.groups.length, events: [] });
    const group = this.groups[this.groups.length - 1];
    group.events.push(event);
    return group;
  }
}

// Provider calls (provider.request -> its provider.response) and tool dispatches (tool.call ->
// tool.result, by the call's id), with their times in ms since the epoch; `end` null: not over.
export function waterfall(events) {
  const bars = [];
  const waiting = []; // provider calls without a response yet, oldest first
  const tools = new Map();
  for (const event of events) {
    const p = event.payload || {};
    switch (event.event_type) {
      case "provider.request": {
        const bar = {
          kind: "provider", id: event.id, start: time(event), end: null, ok: true, request: p,
          label: `${p.purpose === "compaction" ? "compaction: " : ""}${p.provider} ${p.model}, attempt ${p.attempt} (${p.kind})`,
        };
        bars.push(bar);
        waiting.push(bar);
        break;
      }
      case "provider.response": {
        const bar = waiting.shift();
        if (!bar) break;
        bar.end = time(event);
        bar.ok = p.ok !== false;
        if (!bar.ok) bar.label += `: failed${p.status ? ` (${p.status})` : ""}`;
        break;
      }
      case "tool.call": {
        const bar = {
          kind: "tool", dispatch: p.dispatch, id: event.id, start: time(event), end: null, ok: true,
          label: `${p.name}, ${p.dispatch}${p.server_name ? ` ${p.server_name}` : ""}`,
        };
        bars.push(bar);
        tools.set(p.id, bar);
        break;
      }
      case "tool.result": {
        const bar = tools.get(p.tool_use_id);
        if (!bar) break;
        bar.end = time(event);
        bar.ok = !p.is_error;
        if (!bar.ok) bar.label += ": error";
        break;
      }
    }
  }
  const start = events.length ? time(events[0]) : 0;
  const end = events.length ? time(events[events.length - 1]) : 0;
  return { start, end, bars };
}

// Where a turn is: running, waiting for the client's tool results, done, cancelled or failed.
export function turnStatus(events) {
  let status = "running";
  for (const event of events) {
    const p = event.payload || {};
    switch (event.event_type) {
      case "client.message.send":
        status = "running";
        break;
      case "server.message.send":
        if (p.role !== "assistant") break;
        status = blocks(p.content).some((b) => b?.type === "tool_use" && b.dispatch === "client")
          ? "waiting for client tools"
          : "done";
        break;
      case "session.turn.cancelled":
        status = "cancelled";
        break;
      case "session.error":
        if (FATAL_ERRORS.has(p.reason)) status = `failed: ${p.reason}`;
        break;
    }
  }
  return status;
}

// Token counts and cost of the provider responses among `events`. The events carry tokens, not
// money: the cost is priced here at the registry's current prices (GET /admin/v1/providers), the
// entry found by the call's provider kind, base URL and model, cache reads and writes at the input
// price as the server counts them. `priced` false: some call's entry has no prices.
export function usage(events, prices) {
  const total = { calls: 0, input: 0, output: 0, cost: 0, priced: true };
  const waiting = [];
  for (const event of events) {
    const p = event.payload || {};
    if (event.event_type === "provider.request") waiting.push(p);
    if (event.event_type !== "provider.response") continue;
    const request = waiting.shift();
    total.calls += 1;
    if (!p.usage) continue;
    total.input += p.usage.input_tokens || 0;
    total.output += p.usage.output_tokens || 0;
    const price = request && prices.get(priceKey(request.provider, request.base_url, request.model));
    if (price && price.input !== undefined && price.output !== undefined) {
      total.cost += ((p.usage.input_tokens || 0) * price.input + (p.usage.output_tokens || 0) * price.output) / 1e6;
    } else {
      total.priced = false;
    }
  }
  return total;
}

export function priceKey(provider, baseUrl, model) {
  return `${provider} ${(baseUrl || "").replace(/\/+$/, "")} ${model}`;
}

// GET /admin/v1/providers items -> prices by priceKey.
export function pricesOf(providers) {
  return new Map(
    providers.map((entry) => [
      priceKey(entry.provider, entry.base_url, entry.model),
      { input: entry.price_input_per_mtok, output: entry.price_output_per_mtok },
    ]),
  );
}

// Each sandbox image's last known state, from the session.sandbox.* events.
export function sandboxes(events) {
  const byImage = new Map();
  const states = {
    "session.sandbox.start": "starting", "session.sandbox.running": "running", "session.sandbox.stop": "stopping",
    "session.sandbox.stopped": "stopped", "session.sandbox.error": "error",
  };
  for (const event of events) {
    const p = event.payload || {};
    if (event.event_type === "session.sandbox.available") {
      for (const image of p.images || []) {
        if (!byImage.has(image.name)) byImage.set(image.name, { image: image.name, state: `image ${image.status}`, detail: image.detail || "" });
      }
    } else if (states[event.event_type]) {
      const was = byImage.get(p.image) || {};
      byImage.set(p.image, {
        image: p.image,
        state: states[event.event_type],
        sandbox_id: p.sandbox_id || p.container_id || was.sandbox_id || "",
        dispatch: p.dispatch,
        detail: [p.reason, p.phase, p.detail].filter(Boolean).join(": "),
        at: event.created_at,
      });
    }
  }
  return [...byImage.values()];
}

// Each subagent's last known state, from the session.subagent.* events.
export function subagents(events) {
  const byId = new Map();
  for (const event of events) {
    if (!event.event_type.startsWith("session.subagent.")) continue;
    const p = event.payload || {};
    byId.set(p.subagent_id, {
      id: p.subagent_id, harness: p.harness, model: p.model, dispatch: p.dispatch,
      state: event.event_type.slice("session.subagent.".length),
      detail: [p.reason, p.exit_code !== undefined && p.exit_code !== null ? `exit ${p.exit_code}` : "", p.detail]
        .filter(Boolean).join(", "),
      at: event.created_at,
    });
  }
  return [...byId.values()];
}

function preview(text, max = 120) {
  const flat = String(text).replace(/\s+/g, " ").trim();
  return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat;
}

function contentPreview(content) {
  if (typeof content === "string") return preview(content);
  const parts = blocks(content).map((b) => {
    if (b?.type === "text") return b.text;
    if (b?.type === "tool_use") return `[${b.name}${b.dispatch ? `, ${b.dispatch}` : ""}]`;
    if (b?.type === "tool_result") return `[result ${b.tool_use_id}${b.is_error ? ", error" : ""}]`;
    return `[${b?.type}]`;
  });
  return preview(parts.join(" "));
}

// One line about an event, beside its type.
export function summary(event) {
  const p = event.payload || {};
  switch (event.event_type) {
    case "client.message.send":
    case "server.message.send":
      return `${p.synthetic ? `(${p.synthetic}) ` : ""}${contentPreview(p.content)}`;
    case "provider.request":
      return `${p.purpose === "compaction" ? "compaction, " : ""}${p.provider} ${p.model}, attempt ${p.attempt} (${p.kind})`;
    case "provider.response":
      return p.ok === false
        ? `failed${p.status ? ` ${p.status}` : ""}: ${preview(p.error || "", 80)}`
        : `${p.status}${p.usage ? `, ${p.usage.input_tokens} in / ${p.usage.output_tokens} out tokens` : ""}`;
    case "tool.call":
      return `${p.name} (${p.dispatch}${p.server_name ? ` ${p.server_name}` : ""})`;
    case "tool.result":
      return `${p.tool_use_id} (${p.dispatch})${p.is_error ? ", error" : ""}`;
    case "mcp.request":
      return `${p.server_name} ${p.tool}`;
    case "mcp.response":
      return `${p.server_name} ${p.ok ? "ok" : `failed: ${preview(p.error || "", 80)}`}`;
    case "sandbox.request":
      return `${p.tool}: ${preview(p.command || "", 80)}`;
    case "sandbox.response":
      return p.ok ? `exit ${p.result?.exit_code}` : `failed: ${preview(p.error || "", 80)}`;
    case "session.error":
      return `${p.reason}${p.detail ? `: ${preview(p.detail, 80)}` : ""}`;
    case "session.close":
      return p.reason || "";
    case "session.open":
    case "session.join":
      return (p.tools || []).length ? `tools: ${p.tools.join(", ")}` : "";
    default:
      if (event.event_type.startsWith("session.sandbox.")) return [p.image, p.sandbox_id, p.reason, p.detail].filter(Boolean).join(" ");
      if (event.event_type.startsWith("session.subagent.")) return [p.subagent_id, p.harness, p.reason].filter(Boolean).join(" ");
      return "";
  }
}
