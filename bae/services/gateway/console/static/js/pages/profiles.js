// Profiles: list, create and edit as JSON (a PUT replaces the whole profile), soft-delete.

import { api } from "../api.js";
import { resourcePage, timeCell } from "../ops.js";

const list = (values) => (values && values.length ? values.join(", ") : "—");

export async function render(main) {
  await resourcePage(main, {
    title: "Profiles",
    noun: "profile",
    path: "/admin/v1/profiles",
    readOnly: ["id", "created_at", "updated_at"],
    name: (profile) => profile.name,
    help:
      "Provider, MCP server and sandbox names refer to bae-config.toml entries (see Config). limits and " +
      "retention: null keeps the server's defaults.",
    deleteNote: "A deleted profile's name stays reserved. A profile with active client keys cannot be deleted.",
    columns: [
      { label: "Name", cell: (p) => p.name },
      { label: "Id", cell: (p) => p.id },
      { label: "Primary provider", cell: (p) => p.primary_provider },
      { label: "Fallbacks", cell: (p) => list(p.fallback_providers) },
      { label: "Tools", cell: (p) => list(p.allowed_tools) },
      { label: "Sandboxes", cell: (p) => list(p.available_sandboxes) },
      { label: "Updated", cell: (p) => timeCell(p.updated_at) },
    ],
    template: async () => {
      // The first configured provider is the likeliest primary; the operator edits the rest.
      const providers = (await api("/admin/v1/providers")).items;
      return {
        name: "",
        primary_provider: providers.length ? providers[0].name : "",
        fallback_providers: [],
        mcp_servers: [],
        allowed_tools: [],
        available_sandboxes: [],
        limits: null,
        retention: null,
      };
    },
  });
}
