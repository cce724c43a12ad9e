// The configuration this server loaded at start-up (bae-config.toml), as the admin API shows it:
// its provider entries, its MCP servers, and the whole snapshot with every secret already redacted.

import { api } from "../api.js";
import { h, jsonBlock } from "../dom.js";

function table(id, label, columns, items, empty) {
  if (!items.length) return h("p", { class: "muted", id }, empty);
  return h(
    "table",
    { id, "aria-label": label },
    h("thead", {}, h("tr", {}, columns.map(([label]) => h("th", { scope: "col" }, label)))),
    h("tbody", {}, items.map((item) => h("tr", {}, columns.map(([, cell]) => h("td", {}, cell(item)))))),
  );
}

const price = (value) => (value === undefined || value === null ? "—" : `$${value} / Mtok`);

export async function render(main) {
  const [config, providers, servers] = await Promise.all([
    api("/admin/v1/config"),
    api("/admin/v1/providers"),
    api("/admin/v1/mcp-servers"),
  ]);
  main.append(
    h("h1", {}, "Configuration"),
    h("p", { class: "muted" }, "What this server loaded from bae-config.toml at start-up; secrets show as ••••••••."),
    h("h2", {}, "Providers"),
    table(
      "providers",
      "Provider entries",
      [
        ["Name", (p) => p.name],
        ["Kind", (p) => p.provider],
        ["Model", (p) => p.model],
        ["Base URL", (p) => p.base_url],
        ["Input price", (p) => price(p.price_input_per_mtok)],
        ["Output price", (p) => price(p.price_output_per_mtok)],
      ],
      providers.items,
      "No provider entries.",
    ),
    h("h2", {}, "MCP servers"),
    table("mcp-servers", "MCP servers", [["Name", (s) => s.name], ["Transport", (s) => s.transport]], servers.items, "No MCP servers."),
    h("h2", {}, "Snapshot"),
    h("div", { id: "config-json" }, jsonBlock(config)),
  );
}
