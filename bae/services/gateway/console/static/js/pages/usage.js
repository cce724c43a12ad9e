// Usage over a range of UTC days: input and output tokens per day as a chart (uPlot), and the
// totals per client key and per profile with their cost.

import { allPages } from "../api.js";
import { h, clear } from "../dom.js";
import { count, problemBlock } from "../ops.js";
import { loadUplot } from "../uplot.js";

const DAY_SECONDS = 86400;
const DEFAULT_DAYS = 30;
// The chart has a point per day; a range longer than this is refused here rather than drawn.
const MAX_DAYS = 3660;
const CHART_HEIGHT = 280;

const utcDay = (date) => date.toISOString().slice(0, 10);
const dayStart = (day) => Date.parse(`${day}T00:00:00Z`) / 1000;

function usage(groupBy, since, until) {
  return allPages(`/admin/v1/usage?group_by=${groupBy}&since=${since}&until=${until}&limit=200`, 100000);
}

function money(cost) {
  return cost === null || cost === undefined
    ? "—"
    : `$${Number(cost).toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 6 })}`;
}

function usageTable(id, label, firstLabel, first, items) {
  const columns = [
    [firstLabel, first],
    ["Input tokens", (u) => count(u.input_tokens)],
    ["Output tokens", (u) => count(u.output_tokens)],
    ["Cache read", (u) => count(u.cache_read_input_tokens)],
    ["Cache write", (u) => count(u.cache_creation_input_tokens)],
    ["Provider calls", (u) => count(u.provider_calls)],
    ["Turns", (u) => count(u.turns)],
    ["Cost", (u) => money(u.cost_usd)],
  ];
  if (!items.length) return h("p", { class: "muted", id }, "No usage in these days.");
  return h(
    "table",
    { id, class: "numbers", "aria-label": label },
    h("thead", {}, h("tr", {}, columns.map(([label]) => h("th", { scope: "col" }, label)))),
    h("tbody", {}, items.map((u) => h("tr", {}, columns.map(([, cell]) => h("td", {}, cell(u)))))),
  );
}

// [x (UTC midnights, seconds), input tokens, output tokens]: every day of the range, 0 where none.
function chartData(since, until, byDay) {
  const days = new Map(byDay.map((u) => [u.day, u]));
  const data = [[], [], []];
  for (let t = dayStart(since); t <= dayStart(until); t += DAY_SECONDS) {
    const u = days.get(utcDay(new Date(t * 1000)));
    data[0].push(t);
    data[1].push(u ? u.input_tokens : 0);
    data[2].push(u ? u.output_tokens : 0);
  }
  return data;
}

export async function render(main) {
  const today = new Date();
  const since = h("input", { id: "since", type: "date", required: true, value: utcDay(new Date(today - (DEFAULT_DAYS - 1) * DAY_SECONDS * 1000)) });
  const until = h("input", { id: "until", type: "date", required: true, value: utcDay(today) });
  const form = h(
    "form",
    { class: "filters", id: "usage-range" },
    h("label", {}, "Since (UTC day)", since),
    h("label", {}, "Until (UTC day)", until),
    h("button", { type: "submit" }, "Show"),
  );
  const results = h("div", { id: "usage-results" });
  main.append(h("h1", {}, "Usage"), form, results);

  let chart = null;
  // Each show() takes a number; an answer that arrives after a newer show() began, or after the
  // page was left, draws nothing.
  let shows = 0;
  let left = false;
  const chartWidth = () => Math.max(320, results.clientWidth);
  const resize = () => chart?.setSize({ width: chartWidth(), height: CHART_HEIGHT });
  window.addEventListener("resize", resize);

  async function show() {
    const mine = ++shows;
    const [from, to] = [since.value, until.value];
    chart?.destroy();
    chart = null;
    clear(results).append(h("p", { role: "status" }, "Loading…"));
    if ((dayStart(to) - dayStart(from)) / DAY_SECONDS >= MAX_DAYS) {
      clear(results).append(h("div", { class: "error", role: "alert" }, `Choose at most ${MAX_DAYS} days.`));
      return;
    }
    let byDay, byKey, byProfile, keys, profiles, uPlot;
    try {
      [byDay, byKey, byProfile, keys, profiles, uPlot] = await Promise.all([
        usage("day", from, to),
        usage("key", from, to),
        usage("profile", from, to),
        allPages("/admin/v1/keys?limit=200"),
        allPages("/admin/v1/profiles?limit=200"),
        loadUplot(),
      ]);
    } catch (error) {
      if (mine === shows && !left) clear(results).append(problemBlock(error));
      return;
    }
    if (mine !== shows || left) return;
    const keyName = new Map(keys.map((k) => [k.id, k.name]));
    const profileName = new Map(profiles.map((p) => [p.id, p.name]));
    const named = (names, id) => (names.has(id) ? `${names.get(id)} (${id})` : id);
    const plot = h("div", { id: "usage-chart", role: "img", "aria-label": "Input and output tokens per UTC day; the table below has the numbers" });
    clear(results).append(
      h("h2", {}, `Tokens per day, ${from} to ${to} (UTC)`),
      plot,
      h(
        "details",
        {},
        h("summary", {}, "Per day, as a table"),
        usageTable("usage-by-day", "Per UTC day", "Day", (u) => u.day, byDay),
      ),
      h("h2", {}, "Per client key"),
      usageTable("usage-by-key", "Per acting client key", "Client key", (u) => named(keyName, u.client_key_id), byKey),
      h("h2", {}, "Per profile"),
      usageTable("usage-by-profile", "Per profile", "Profile", (u) => named(profileName, u.profile_id), byProfile),
    );
    chart = new uPlot(
      {
        width: chartWidth(),
        height: CHART_HEIGHT,
        // Days are UTC days: the axis is labelled in UTC, whatever the browser's zone.
        tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
        scales: { y: { range: (u, min, max) => [0, Math.max(10, max)] } },
        series: [
          { label: "Day", value: (u, ts) => (ts === null ? "—" : utcDay(new Date(ts * 1000))) },
          { label: "Input tokens", stroke: "#2457d6", width: 2, value: (u, v) => count(v) },
          { label: "Output tokens", stroke: "#1f7a3a", width: 2, value: (u, v) => count(v) },
        ],
        axes: [{}, { size: 70, values: (u, ticks) => ticks.map((v) => count(v)) }],
      },
      chartData(from, to, byDay),
      plot,
    );
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    show();
  });
  await show();
  return () => {
    left = true;
    window.removeEventListener("resize", resize);
    chart?.destroy();
  };
}
