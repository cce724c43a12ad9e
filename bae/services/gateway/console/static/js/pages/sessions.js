// #/sessions: the admin API's session list, filtered and paged by its cursors. The filters live in
// the address (#/sessions?state=open&profile_id=...), so a reload or a shared link keeps them;
// the page cursors do not (a reload starts again at the first page).

import { api, allPages } from "../api.js";
import { h, clear, errorBlock, table, formatTime } from "../dom.js";

const STATES = ["open", "closed", "error"];
const PAGE_SIZE = 50;
// The list's filters, as the admin API names its query parameters.
const FILTERS = ["state", "profile_id", "client_key_id", "created_after", "created_before", "id_prefix"];
// A session id is a prefix plus 32 hex characters: a longer prefix can match nothing.
const MAX_ID_PREFIX = 64;

export async function render(main) {
  const filters = filtersOf(location.hash);
  const [profiles, keys] = await Promise.all([allPages("/admin/v1/profiles"), allPages("/admin/v1/keys")]);
  const profileNames = new Map(profiles.map((p) => [p.id, p.name]));
  const keyNames = new Map(keys.map((k) => [k.id, k.name]));

  const form = filterForm(filters, profiles, keys);
  const results = h("div", { id: "session-results", "aria-live": "polite" });
  main.append(h("h1", {}, "Sessions"), form, results);

  // The cursors of the pages before the one shown ("" is the first page): Previous pops one.
  const cursors = [];
  let cursor = "";
  let loads = 0; // an answer to an older load than the last is dropped

  async function load() {
    const mine = ++loads;
    const query = new URLSearchParams();
    for (const name of FILTERS) if (filters[name]) query.set(name, filters[name]);
    query.set("limit", String(PAGE_SIZE));
    if (cursor) query.set("cursor", cursor);
    let page;
    try {
      page = await api(`/admin/v1/sessions?${query}`);
    } catch (error) {
      if (mine === loads) clear(results).append(errorBlock(error));
      return;
    }
    if (mine !== loads) return;
    const previous = h("button", { type: "button", class: "secondary", id: "sessions-previous", disabled: !cursors.length }, "Previous");
    const next = h("button", { type: "button", class: "secondary", id: "sessions-next", disabled: !page.next_cursor }, "Next");
    previous.addEventListener("click", () => {
      cursor = cursors.pop() ?? "";
      load();
    });
    next.addEventListener("click", () => {
      cursors.push(cursor);
      cursor = page.next_cursor;
      load();
    });
    clear(results).append(
      page.items.length
        ? sessionTable(page.items, profileNames, keyNames)
        : h("p", { class: "muted" }, cursors.length ? "No more sessions." : "No session matches these filters."),
      h("div", { class: "pager" }, previous, next, h("span", { class: "muted" }, `Page ${cursors.length + 1}`)),
    );
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const chosen = readForm(form);
    if (chosen === null) return;
    Object.assign(filters, chosen);
    // pushState changes the address without a hashchange: the page stays, only the list reloads;
    // Back brings the earlier filters (that traversal is a hashchange, which renders them).
    history.pushState(null, "", hashOf(filters));
    cursors.length = 0;
    cursor = "";
    load();
  });
  form.addEventListener("reset", (event) => {
    // The controls' defaults are the filters the page opened with: clear them instead.
    event.preventDefault();
    for (const control of form.querySelectorAll("input, select")) control.value = "";
    for (const old of form.querySelectorAll(".error")) old.remove();
    for (const name of FILTERS) filters[name] = "";
    history.pushState(null, "", hashOf(filters));
    cursors.length = 0;
    cursor = "";
    load();
  });
  await load();
}

function filtersOf(hash) {
  const query = new URLSearchParams(hash.split("?")[1] || "");
  return Object.fromEntries(FILTERS.map((name) => [name, query.get(name) || ""]));
}

function hashOf(filters) {
  const query = new URLSearchParams();
  for (const name of FILTERS) if (filters[name]) query.set(name, filters[name]);
  const text = query.toString();
  return text ? `#/sessions?${text}` : "#/sessions";
}

function select(id, value, options) {
  // A value from the address that no option has (a revoked key, a deleted profile) stays selectable.
  if (value && !options.some(([v]) => v === value)) options = [...options, [value, value]];
  return h(
    "select",
    { id, name: id },
    h("option", { value: "" }, "any"),
    options.map(([v, label]) => h("option", { value: v, selected: v === value }, label)),
  );
}

function field(id, label, control) {
  return h("label", { for: id }, label, control);
}

function filterForm(filters, profiles, keys) {
  return h(
    "form",
    { class: "filters", id: "session-filters", role: "search", "aria-label": "Session filters" },
    field("filter-state", "State", select("filter-state", filters.state, STATES.map((s) => [s, s]))),
    field("filter-profile", "Profile", select("filter-profile", filters.profile_id, profiles.map((p) => [p.id, p.name]))),
    field("filter-key", "Client key", select("filter-key", filters.client_key_id, keys.map((k) => [k.id, `${k.name} (${k.prefix})`]))),
    field("filter-after", "Created after", h("input", { id: "filter-after", type: "datetime-local", step: 1, value: localInput(filters.created_after) })),
    field("filter-before", "Created before", h("input", { id: "filter-before", type: "datetime-local", step: 1, value: localInput(filters.created_before) })),
    field("filter-id", "Id starts with", h("input", { id: "filter-id", type: "search", maxlength: MAX_ID_PREFIX, placeholder: "ses_…", value: filters.id_prefix, autocomplete: "off" })),
    h("button", { type: "submit" }, "Apply"),
    h("button", { type: "reset", class: "secondary" }, "Clear"),
  );
}

// The form's filters, or null (with the control that is wrong marked and focused) when one is invalid.
function readForm(form) {
  const value = (id) => form.querySelector(`#${id}`).value.trim();
  const chosen = {
    state: value("filter-state"),
    profile_id: value("filter-profile"),
    client_key_id: value("filter-key"),
    created_after: rfc3339(value("filter-after")),
    created_before: rfc3339(value("filter-before")),
    id_prefix: value("filter-id"),
  };
  for (const old of form.querySelectorAll(".error")) old.remove();
  if (chosen.created_after && chosen.created_before && chosen.created_after > chosen.created_before) {
    form.append(errorBlock(new Error("“Created after” is later than “Created before”.")));
    form.querySelector("#filter-after").focus();
    return null;
  }
  return chosen;
}

// A datetime-local value is the browser's local time: the API takes RFC 3339 UTC.
function rfc3339(local) {
  if (!local) return "";
  const time = new Date(local);
  return Number.isNaN(time.getTime()) ? "" : time.toISOString().replace(/\.000Z$/, "Z");
}

function localInput(iso) {
  const time = iso ? new Date(iso) : null;
  if (!time || Number.isNaN(time.getTime())) return "";
  const local = new Date(time.getTime() - time.getTimezoneOffset() * 60_000);
  return local.toISOString().slice(0, 19);
}

function sessionTable(items, profileNames, keyNames) {
  return table(
    [
      { label: "Session", cell: (s) => h("a", { href: `#/sessions/${encodeURIComponent(s.id)}`, class: "mono" }, s.id) },
      { label: "State", cell: (s) => h("span", { class: `state state-${s.state}` }, s.state) },
      { label: "Profile", cell: (s) => profileNames.get(s.profile_id) || s.profile_id },
      { label: "Client key", cell: (s) => (s.client_key_id ? keyNames.get(s.client_key_id) || s.client_key_id : "") },
      { label: "Client version", cell: (s) => s.client_version || "" },
      { label: "Created", cell: (s) => formatTime(s.created_at) },
      { label: "Closed", cell: (s) => formatTime(s.closed_at) },
    ],
    items,
    { caption: "Sessions, oldest first" },
  );
}
