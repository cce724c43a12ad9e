// Webhooks: list, create and edit as JSON, delete; each webhook's deliveries with a retry button,
// and secret rotation. A signing secret is shown once: in the answer that issued it.

import { api } from "../api.js";
import { h, formatTime } from "../dom.js";
import {
  confirmStep, count, listing, problemBlock, resourcePage, rowButton, secretBox, showListing, statusLine, timeCell,
} from "../ops.js";

const PATH = "/admin/v1/webhooks";
const ONCE = "Store it in the receiver now: it is shown only this once, the server never shows it again.";

function deliveries(webhook, ui) {
  const base = `${PATH}/${encodeURIComponent(webhook.id)}/deliveries`;
  const said = h("div");
  const list = listing(
    base,
    [
      { label: "Delivery", cell: (d) => d.id },
      { label: "Event", cell: (d) => `${d.event_type} (${d.event_id})` },
      { label: "State", cell: (d) => h("span", { class: `state ${d.state}` }, d.state) },
      { label: "Attempts", cell: (d) => count(d.attempts) },
      { label: "Last status", cell: (d) => (d.last_status === null ? "" : String(d.last_status)) },
      { label: "Last error", cell: (d) => d.last_error || "" },
      { label: "Next attempt", cell: (d) => timeCell(d.next_attempt_at) },
      { label: "Queued", cell: (d) => timeCell(d.created_at) },
      { label: "Delivered", cell: (d) => timeCell(d.delivered_at) },
      { label: "Actions", cell: (d) => rowButton("Retry", `Retry ${d.id}`, () => retry(d)) },
    ],
    { label: `Deliveries of ${webhook.url}`, empty: "No deliveries in the log." },
  );
  async function retry(delivery) {
    said.replaceChildren();
    try {
      const answer = await api(`${base}/${encodeURIComponent(delivery.id)}/retry`, { method: "POST" });
      said.append(statusLine(`Delivery ${answer.id} is ${answer.state} again and due now.`));
      await list.reload();
    } catch (error) {
      said.append(problemBlock(error));
    }
  }
  return rowButton("Deliveries", `Deliveries of ${webhook.url}`, () => showListing(ui, `Deliveries of ${webhook.url}`, list, said));
}

function rotate(webhook, ui) {
  return rowButton("Rotate secret…", `Rotate the secret of ${webhook.url}`, () =>
    ui.show(
      ...confirmStep({
        title: `Rotate the signing secret of ${webhook.url}?`,
        body: h("p", {}, "A new secret signs its deliveries from now on; the current one stays valid for 24 hours."),
        confirmLabel: "Rotate secret",
        cancel: ui.close,
        confirm: async () => {
          const answer = await api(`${PATH}/${encodeURIComponent(webhook.id)}/rotate-secret`, { method: "POST" });
          ui.show(
            secretBox({ title: `New signing secret of ${webhook.url}`, secret: answer.secret, note: ONCE }),
            statusLine(`The previous secret stays valid until ${formatTime(answer.previous_expires_at)}.`),
          );
        },
      }),
    ),
  );
}

export async function render(main) {
  await resourcePage(main, {
    title: "Webhooks",
    noun: "webhook",
    path: PATH,
    readOnly: ["id", "created_at", "updated_at"],
    name: (w) => w.url,
    help:
      'event_types lists event types (e.g. "server.message.send") or is ["*"]; profile_id null means every ' +
      "profile. A URL whose host resolves to an internal address is refused unless [webhooks] allow_hosts lists it.",
    deleteNote: "Its pending deliveries and its delivery log are deleted with it.",
    columns: [
      { label: "URL", cell: (w) => w.url },
      { label: "Id", cell: (w) => w.id },
      { label: "Events", cell: (w) => w.event_types.join(", ") },
      { label: "Profile", cell: (w) => w.profile_id || "every profile" },
      { label: "Enabled", cell: (w) => (w.enabled ? "yes" : "no") },
    ],
    rowActions: (webhook, ui) => [deliveries(webhook, ui), rotate(webhook, ui)],
    created: (answer) => secretBox({ title: `Signing secret of ${answer.url}`, secret: answer.secret, note: ONCE }),
    template: () => ({ url: "https://", event_types: ["*"], profile_id: null, enabled: true }),
  });
}
