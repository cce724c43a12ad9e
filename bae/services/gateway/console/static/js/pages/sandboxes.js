// Sandbox images per profile, as this gateway's session service sees them; refreshed every few
// seconds while an image is still being pulled.

import { api, allPages } from "../api.js";
import { h, clear } from "../dom.js";
import { problemBlock } from "../ops.js";

const REFRESH_MS = 3000;

function statusTable(items, profileName) {
  const rows = items.flatMap((item) =>
    item.images.map((image, i) =>
      h(
        "tr",
        {},
        i === 0 ? h("th", { scope: "rowgroup", rowspan: item.images.length }, profileName(item.profile_id)) : null,
        h("td", {}, h("code", {}, image.name)),
        h("td", {}, h("span", { class: `state ${image.status}` }, image.status)),
        h("td", {}, image.detail || ""),
      ),
    ),
  );
  return h(
    "table",
    { "aria-label": "Sandbox images" },
    h("thead", {}, h("tr", {}, ["Profile", "Image", "Status", "Detail"].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, rows),
  );
}

export async function render(main) {
  const view = h("div", { id: "sandbox-status", "aria-live": "polite" });
  const refresh = h("button", { type: "button", class: "secondary" }, "Refresh");
  main.append(
    h("h1", {}, "Sandboxes"),
    h("p", { class: "muted" }, "The images each profile declares, as this process last pulled them."),
    h("p", {}, refresh),
    view,
  );
  let timer = null;
  let stopped = false;

  async function load() {
    clearTimeout(timer);
    timer = null;
    let status;
    try {
      // Profiles are read each time: one created meanwhile names its row.
      const [profiles, answer] = await Promise.all([
        allPages("/admin/v1/profiles?limit=200"),
        api("/admin/v1/sandbox-status"),
      ]);
      status = { ...answer, names: new Map(profiles.map((p) => [p.id, p.name])) };
    } catch (error) {
      if (!stopped) clear(view).append(problemBlock(error));
      return;
    }
    if (stopped) return;
    const pending = status.items.some((item) => item.images.some((image) => image.status === "pending"));
    clear(view).append(
      status.items.length
        ? statusTable(status.items, (id) => (status.names.has(id) ? `${status.names.get(id)} (${id})` : id))
        : h("p", {}, "No profile declares sandbox images."),
      h(
        "p",
        { class: "muted", id: "refresh-note" },
        pending ? `An image is still being pulled: refreshing every ${REFRESH_MS / 1000} s.` : "Every image has settled.",
      ),
    );
    clearTimeout(timer); // a Refresh click while a load was under way has set one too
    if (pending) timer = setTimeout(load, REFRESH_MS);
  }

  refresh.addEventListener("click", load);
  await load();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
