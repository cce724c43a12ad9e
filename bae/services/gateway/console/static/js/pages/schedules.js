// Schedules: list, create and edit as JSON (a PUT replaces the whole schedule), delete, and each
// schedule's runs.

import { h } from "../dom.js";
import { listing, resourcePage, rowButton, sessionLink, showListing, timeCell } from "../ops.js";

const PATH = "/admin/v1/schedules";

function runs(schedule, ui) {
  const list = listing(
    `${PATH}/${encodeURIComponent(schedule.id)}/runs`,
    [
      { label: "Run", cell: (r) => r.run_id },
      { label: "Scheduled for", cell: (r) => timeCell(r.scheduled_for) },
      { label: "Fired", cell: (r) => timeCell(r.fired_at) },
      { label: "Session", cell: (r) => sessionLink(r.session_id) },
      { label: "Outcome", cell: (r) => h("span", { class: `state ${r.outcome}` }, r.outcome) },
      { label: "Detail", cell: (r) => r.detail || "" },
    ],
    { label: `Runs of ${schedule.name}`, empty: "No runs yet." },
  );
  return rowButton("Runs", `Runs of ${schedule.name}`, () => showListing(ui, `Runs of ${schedule.name}`, list));
}

export async function render(main) {
  await resourcePage(main, {
    title: "Schedules",
    noun: "schedule",
    path: PATH,
    readOnly: ["id", "next_fire_at", "created_at", "updated_at"],
    name: (s) => s.name,
    help:
      "cron has five fields (minute hour day-of-month month day-of-week), read in timezone. The profile must " +
      "allow no client tools and the client key must belong to it. overlap: skip, queue or allow; catch_up: " +
      "latest or none.",
    deleteNote: "Its runs are deleted with it; their sessions stay.",
    columns: [
      { label: "Name", cell: (s) => s.name },
      { label: "Id", cell: (s) => s.id },
      { label: "Cron", cell: (s) => h("code", {}, `${s.cron} (${s.timezone})`) },
      { label: "Enabled", cell: (s) => (s.enabled ? "yes" : "no") },
      { label: "Next fire", cell: (s) => (s.next_fire_at ? timeCell(s.next_fire_at) : "—") },
      { label: "Profile", cell: (s) => s.profile_id },
      { label: "Client key", cell: (s) => s.client_key_id },
    ],
    rowActions: (schedule, ui) => [runs(schedule, ui)],
    template: () => ({
      name: "",
      profile_id: "",
      client_key_id: "",
      cron: "0 * * * *",
      timezone: "UTC",
      message: "",
      overlap: "skip",
      catch_up: "latest",
      close_after: true,
      enabled: true,
    }),
  });
}
