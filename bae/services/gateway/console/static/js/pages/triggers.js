// HTTP triggers: list, create and edit as JSON (a PUT replaces the whole trigger), delete, and each
// trigger's runs.

import { h } from "../dom.js";
import { listing, resourcePage, rowButton, sessionLink, showListing, timeCell } from "../ops.js";

const PATH = "/admin/v1/triggers";

function runs(trigger, ui) {
  const list = listing(
    `${PATH}/${encodeURIComponent(trigger.id)}/runs`,
    [
      { label: "Run", cell: (r) => r.run_id },
      { label: "Fired", cell: (r) => timeCell(r.fired_at) },
      { label: "Session", cell: (r) => sessionLink(r.session_id) },
      { label: "Outcome", cell: (r) => h("span", { class: `state ${r.outcome}` }, r.outcome) },
      { label: "Detail", cell: (r) => r.detail || "" },
      { label: "Idempotency key", cell: (r) => r.idempotency_key || "" },
    ],
    { label: `Runs of ${trigger.name}`, empty: "No runs yet." },
  );
  return rowButton("Runs", `Runs of ${trigger.name}`, () => showListing(ui, `Runs of ${trigger.name}`, list));
}

export async function render(main) {
  await resourcePage(main, {
    title: "HTTP triggers",
    noun: "trigger",
    path: PATH,
    readOnly: ["id", "created_at", "updated_at"],
    name: (t) => t.name,
    help:
      "Called as POST /api/v1/triggers/<name> on the client port. message_template's {field} placeholders " +
      "must be properties of input_schema (a JSON Schema); the profile must allow no client tools.",
    deleteNote: "Its runs are deleted with it; their sessions stay.",
    columns: [
      { label: "Name", cell: (t) => t.name },
      { label: "Id", cell: (t) => t.id },
      { label: "Profile", cell: (t) => t.profile_id },
      { label: "Closes after", cell: (t) => (t.close_after ? "yes" : "no") },
      { label: "Updated", cell: (t) => timeCell(t.updated_at) },
    ],
    rowActions: (trigger, ui) => [runs(trigger, ui)],
    template: () => ({
      name: "",
      profile_id: "",
      input_schema: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
      message_template: "{text}",
      close_after: true,
    }),
  });
}
