// Building blocks of the operations pages (profiles, keys, schedules, triggers, webhooks): a
// paginated list, a JSON form that shows the server's refusal as it was said, a confirm step, and
// a box for a secret the server shows once.

import { api } from "./api.js";
import { h, clear, formatTime } from "./dom.js";

const PAGE_SIZE = 50;

// The server's refusal next to what was tried: its detail verbatim, then its status and type slug.
export function problemBlock(error) {
  const problem = error.problem || {};
  return h(
    "div",
    { class: "error", role: "alert" },
    error.message || String(error),
    problem.type ? h("span", { class: "slug" }, ` (${error.status} ${problem.type})`) : null,
  );
}

export function statusLine(text) {
  return h("p", { class: "ok", role: "status" }, text);
}

// A link to a session's page, or nothing for a run that opened none.
export function sessionLink(id) {
  return id ? h("a", { href: `#/sessions/${encodeURIComponent(id)}` }, id) : "";
}

export function timeCell(iso) {
  return iso ? h("time", { datetime: iso }, formatTime(iso)) : "";
}

export function heading(text) {
  // tabindex=-1: focus moves here when a panel opens, so a keyboard or screen reader user lands on it.
  return h("h2", { tabindex: "-1" }, text);
}

// A panel where one action at a time (a form, a confirm step, a run list) is shown.
export function panel() {
  const element = h("section", { id: "panel", "aria-live": "polite" });
  return {
    element,
    show(...children) {
      clear(element).append(h("div", { class: "card" }, children));
      element.querySelector("h2")?.focus();
    },
    close() {
      clear(element);
    },
  };
}

// Loads `list` from its first page and shows it in the panel under `title` (or why it could not).
export async function showListing(ui, title, list, ...before) {
  try {
    await list.reload();
    ui.show(heading(title), ...before, list.element);
  } catch (error) {
    ui.show(heading(title), problemBlock(error));
  }
}

// A paginated admin list as a table, with a button that follows `next_cursor`. `columns` are
// {label, cell(item)}; `reload()` starts again from the first page.
export function listing(path, columns, { label, empty = "None yet." } = {}) {
  const body = h("tbody");
  const more = h("button", { type: "button", class: "secondary", hidden: true }, "Show more");
  const none = h("p", { class: "muted", hidden: true }, empty);
  const errors = h("div");
  const element = h(
    "div",
    { class: "listing" },
    h(
      "table",
      { "aria-label": label },
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col" }, c.label)))),
      body,
    ),
    none,
    more,
    errors,
  );
  let cursor = "";
  async function load(from) {
    const sep = path.includes("?") ? "&" : "?";
    const page = await api(`${path}${sep}limit=${PAGE_SIZE}${from ? `&cursor=${encodeURIComponent(from)}` : ""}`);
    body.append(...page.items.map((item) => h("tr", {}, columns.map((c) => h("td", {}, c.cell(item))))));
    cursor = page.next_cursor || "";
    more.hidden = !cursor;
    none.hidden = body.children.length > 0;
  }
  more.addEventListener("click", async () => {
    clear(errors);
    try {
      await load(cursor);
    } catch (error) {
      errors.append(problemBlock(error));
    }
  });
  return {
    element,
    async reload() {
      clear(body);
      clear(errors);
      await load("");
    },
  };
}

// A JSON document edited in a <textarea> and sent by `submit(value)`; a refusal (local JSON syntax
// or the server's problem) is shown under the form and the text is left as typed.
export function jsonForm({ title, value, submitLabel, help, submit, cancel }) {
  const textarea = h("textarea", { id: "json-body", spellcheck: "false", rows: 20 });
  textarea.value = JSON.stringify(value, null, 2);
  const errors = h("div", { id: "form-error" });
  const send = h("button", { type: "submit" }, submitLabel);
  const form = h(
    "form",
    { class: "json-form", id: "json-form" },
    heading(title),
    help ? h("p", { class: "muted", id: "json-help" }, help) : null,
    h("label", { for: "json-body" }, "JSON"),
    textarea,
    errors,
    h("div", { class: "actions" }, send, h("button", { type: "button", class: "secondary", onclick: cancel }, "Cancel")),
  );
  if (help) textarea.setAttribute("aria-describedby", "json-help");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clear(errors);
    let parsed;
    try {
      parsed = JSON.parse(textarea.value);
    } catch (error) {
      errors.append(h("div", { class: "error", role: "alert" }, `Not valid JSON: ${error.message}`));
      return;
    }
    send.disabled = true;
    try {
      await submit(parsed);
    } catch (error) {
      errors.append(problemBlock(error));
    } finally {
      send.disabled = false;
    }
  });
  return form;
}

// A question with a confirming button (class danger) and Cancel; `confirm()` runs on the former.
export function confirmStep({ title, body, confirmLabel, confirm, cancel }) {
  const errors = h("div", { id: "confirm-error" });
  const yes = h("button", { type: "button", class: "danger", id: "confirm" }, confirmLabel);
  yes.addEventListener("click", async () => {
    clear(errors);
    yes.disabled = true;
    try {
      await confirm();
    } catch (error) {
      errors.append(problemBlock(error));
      yes.disabled = false;
    }
  });
  return [
    heading(title),
    body,
    errors,
    h("div", { class: "actions" }, yes, h("button", { type: "button", class: "secondary", onclick: cancel }, "Cancel")),
  ];
}

// A secret the server answers once (a client key, a webhook signing secret), with a Copy button.
// Nothing keeps it: it is gone from the page as soon as another page or action replaces this box.
export function secretBox({ title, secret, note }) {
  const value = h("code", { id: "secret-value" }, secret);
  const said = h("span", { role: "status", class: "muted" });
  const copy = h("button", { type: "button", class: "secondary", id: "copy-secret" }, "Copy");
  copy.addEventListener("click", async () => {
    try {
      // Only in a secure context (https, or a loopback address); elsewhere the text is selected.
      if (!navigator.clipboard) throw new Error("this page is not served over https");
      await navigator.clipboard.writeText(secret);
      said.textContent = "Copied to the clipboard.";
    } catch (error) {
      const range = document.createRange();
      range.selectNodeContents(value);
      getSelection().removeAllRanges();
      getSelection().addRange(range);
      said.textContent = `Could not copy (${error.message}): the text is selected, press Ctrl+C.`;
    }
  });
  return h(
    "div",
    { class: "secret-box", id: "secret-box", role: "region", "aria-label": title },
    h("h2", { tabindex: "-1" }, title),
    h("p", { class: "secret" }, value),
    h("p", { class: "warn" }, note),
    h("div", { class: "actions" }, copy, said),
  );
}

// The fields a resource answers that a PUT does not take.
function withoutFields(item, fields) {
  const copy = { ...item };
  for (const field of fields) delete copy[field];
  return copy;
}

// A page of a JSON-edited resource (profiles, schedules, triggers, webhooks): a list with Edit and
// Delete per row, a New button, and whatever more each row offers (`rowActions`).
//   spec: {title, path, noun, columns, readOnly, template() -> new item's JSON, help,
//          name(item), rowActions(item, ui) -> buttons, created(answer) -> element shown after
//          a create (a secret), deleteNote}
export async function resourcePage(main, spec) {
  const ui = panel();
  const actionsColumn = {
    label: "Actions",
    cell: (item) =>
      h(
        "div",
        { class: "actions" },
        button(`Edit`, `Edit ${spec.name(item)}`, () => edit(item)),
        ...(spec.rowActions ? spec.rowActions(item, ui) : []),
        button("Delete…", `Delete ${spec.name(item)}`, () => remove(item), "danger"),
      ),
  };
  const list = listing(spec.path, [...spec.columns, actionsColumn], { label: spec.title, empty: `No ${spec.noun}s yet.` });

  // After a change the server accepted: said in the panel, then the list read again (a failure to
  // read it is said there too; the change stands).
  async function done(message, extra) {
    ui.show(extra || null, statusLine(message));
    try {
      await list.reload();
    } catch (error) {
      ui.element.append(problemBlock(error));
    }
  }

  async function create() {
    ui.show(
      jsonForm({
        title: `New ${spec.noun}`,
        value: await spec.template(),
        submitLabel: `Create ${spec.noun}`,
        help: spec.help,
        cancel: ui.close,
        submit: async (body) => {
          const answer = await api(spec.path, { method: "POST", body });
          await done(`Created ${spec.noun} ${spec.name(answer)} (${answer.id}).`, spec.created?.(answer));
        },
      }),
    );
  }

  async function edit(item) {
    // The current version, not the row's: another operator may have changed it since the list loaded.
    const current = await api(`${spec.path}/${encodeURIComponent(item.id)}`);
    ui.show(
      jsonForm({
        title: `Edit ${spec.noun} ${spec.name(current)}`,
        value: withoutFields(current, spec.readOnly),
        submitLabel: "Save",
        help: `${spec.help ? `${spec.help} ` : ""}Saving replaces the whole ${spec.noun} (${item.id}).`,
        cancel: ui.close,
        submit: async (body) => {
          const answer = await api(`${spec.path}/${encodeURIComponent(item.id)}`, { method: "PUT", body });
          await done(`Saved ${spec.noun} ${spec.name(answer)}.`);
        },
      }),
    );
  }

  function remove(item) {
    ui.show(
      ...confirmStep({
        title: `Delete ${spec.noun} ${spec.name(item)}?`,
        body: h("p", {}, `${item.id}. ${spec.deleteNote || ""}`),
        confirmLabel: `Delete ${spec.noun}`,
        cancel: ui.close,
        confirm: async () => {
          await api(`${spec.path}/${encodeURIComponent(item.id)}`, { method: "DELETE" });
          await done(`Deleted ${spec.noun} ${spec.name(item)}.`);
        },
      }),
    );
  }

  function guarded(action) {
    return async () => {
      try {
        await action();
      } catch (error) {
        ui.show(heading("Error"), problemBlock(error));
      }
    };
  }

  main.append(
    h("h1", {}, spec.title),
    h("p", {}, button(`New ${spec.noun}`, null, create, null, "new")),
    ui.element,
    list.element,
  );
  await list.reload();

  function button(text, label, onclick, kind = "secondary", id) {
    return h("button", { type: "button", class: kind, "aria-label": label, id, onclick: guarded(onclick) }, text);
  }
}

// A button of a row; `label` names the row's item for a screen reader ("Runs of nightly").
export function rowButton(text, label, onclick, kind = "secondary") {
  return h("button", { type: "button", class: kind, "aria-label": label, onclick }, text);
}

// A number with thousands separators; a missing one is shown as a dash.
export function count(n) {
  return n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US");
}
