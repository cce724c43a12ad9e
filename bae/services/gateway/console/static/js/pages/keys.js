// Client keys: create (the plaintext is shown once, here, and never again), list, revoke with the
// sessions it will close counted before the operator confirms.

import { api, allPages } from "../api.js";
import { h, clear } from "../dom.js";
import {
  confirmStep, heading, listing, panel, problemBlock, rowButton, secretBox, sessionLink, statusLine, timeCell,
} from "../ops.js";

// How many of a key's open sessions the revoke step counts (and lists at most SHOWN of).
const COUNT_LIMIT = 10000;
const SHOWN = 20;

function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many}`;
}

async function openSessionsOf(keyId) {
  return allPages(`/admin/v1/sessions?client_key_id=${encodeURIComponent(keyId)}&state=open&limit=200`, COUNT_LIMIT);
}

export async function render(main) {
  const profiles = await allPages("/admin/v1/profiles?limit=200");
  const profileName = new Map(profiles.map((p) => [p.id, p.name]));
  const ui = panel();
  const list = listing(
    "/admin/v1/keys",
    [
      { label: "Name", cell: (k) => k.name },
      { label: "Id", cell: (k) => k.id },
      { label: "Prefix", cell: (k) => h("code", {}, k.prefix) },
      { label: "Profile", cell: (k) => profileName.get(k.profile_id) || k.profile_id },
      { label: "Created", cell: (k) => timeCell(k.created_at) },
      { label: "Last used", cell: (k) => (k.last_used_at ? timeCell(k.last_used_at) : "never") },
      { label: "Actions", cell: (k) => rowButton("Revoke…", `Revoke ${k.name}`, () => revoke(k), "danger") },
    ],
    { label: "Client keys", empty: "No active client keys." },
  );

  async function revoke(key) {
    ui.show(heading(`Revoke key ${key.name}?`), h("p", { role: "status" }, "Counting its open sessions…"));
    let open;
    try {
      open = await openSessionsOf(key.id);
    } catch (error) {
      ui.show(heading(`Revoke key ${key.name}?`), problemBlock(error));
      return;
    }
    const capped = open.length >= COUNT_LIMIT;
    const cascade = h(
      "div",
      { id: "cascade" },
      h("p", {}, `${key.id}: it and every session key minted for it stop working at once.`),
      h(
        "p",
        { class: "cascade", id: "cascade-count" },
        open.length === 0
          ? "No open session will be closed."
          : `${capped ? "At least " : ""}${plural(open.length, "open session", "open sessions")} will be closed.`,
      ),
      open.length
        ? h(
            "ul",
            {},
            open.slice(0, SHOWN).map((s) => h("li", {}, sessionLink(s.id))),
            open.length > SHOWN ? h("li", {}, `and ${open.length - SHOWN} more`) : null,
          )
        : null,
      open.length
        ? h("p", { class: "muted" }, "A session another key has joined stays open for that key; this key loses its access.")
        : null,
    );
    ui.show(
      ...confirmStep({
        title: `Revoke key ${key.name}?`,
        body: cascade,
        confirmLabel: "Revoke key",
        cancel: ui.close,
        confirm: async () => {
          await api(`/admin/v1/keys/${encodeURIComponent(key.id)}`, { method: "DELETE" });
          // Revoked: from here on a failure to read is said beside the result, never as a refusal.
          try {
            const still = await openSessionsOf(key.id);
            ui.show(
              heading(`Key ${key.name} revoked`),
              statusLine(
                `Revoked ${key.name} (${key.id}). ${plural(open.length - still.length, "session was", "sessions were")} closed` +
                  (still.length ? `; ${plural(still.length, "session stays", "sessions stay")} open for the keys that joined.` : "."),
              ),
            );
            await list.reload();
          } catch (error) {
            ui.show(heading(`Key ${key.name} revoked`), statusLine(`Revoked ${key.name} (${key.id}).`), problemBlock(error));
          }
        },
      }),
    );
  }

  const created = h("div", { id: "created" });
  const name = h("input", { id: "key-name", required: true, maxlength: 200, autocomplete: "off" });
  const profile = h(
    "select",
    { id: "key-profile", required: true },
    profiles.map((p) => h("option", { value: p.id }, `${p.name} (${p.id})`)),
  );
  const errors = h("div");
  const form = h(
    "form",
    { class: "card", id: "new-key" },
    h("h2", {}, "New client key"),
    h("label", { for: "key-name" }, "Name"),
    name,
    h("label", { for: "key-profile" }, "Profile"),
    profile,
    errors,
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Create key")),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clear(errors);
    clear(created);
    try {
      const key = await api("/admin/v1/keys", { method: "POST", body: { name: name.value, profile_id: profile.value } });
      name.value = "";
      created.append(
        secretBox({
          title: `New key ${key.name}: copy it now`,
          secret: key.key,
          note:
            "This is the only time the key is shown: the server keeps only a hash of it. " +
            "Copy it now; it will not be shown again once you leave this page.",
        }),
      );
      created.querySelector("h2").focus();
      await list.reload();
    } catch (error) {
      errors.append(problemBlock(error));
    }
  });

  main.append(
    h("h1", {}, "Client keys"),
    profiles.length ? form : h("p", {}, "Create a key once a profile exists: ", h("a", { href: "#/profiles" }, "Profiles"), "."),
    created,
    ui.element,
    list.element,
  );
  await list.reload();
}
