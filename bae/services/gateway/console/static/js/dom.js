// Small DOM helpers: elements are built with h() and text is always set as text, never as HTML,
// so nothing the server returns can become markup.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

// A <pre> holding pretty-printed JSON.
export function jsonBlock(value) {
  return h("pre", { class: "json" }, JSON.stringify(value, null, 2));
}

// The server's error, as a block the page shows where the action was (role=alert reads it out).
export function errorBlock(error) {
  return h("div", { class: "error", role: "alert" }, error.message || String(error));
}

export function table(columns, rows, { caption } = {}) {
  return h(
    "table",
    {},
    caption ? h("caption", {}, caption) : null,
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col" }, c.label)))),
    h("tbody", {}, rows.map((row) => h("tr", {}, columns.map((c) => h("td", {}, c.cell(row)))))),
  );
}

export function formatTime(iso) {
  return iso ? iso.replace("T", " ").replace(/\.\d+/, "").replace("Z", " UTC") : "";
}
