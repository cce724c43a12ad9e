import { h } from "../dom.js";

export async function render(main) {
  main.append(h("h1", {}, "config"), h("p", {}, "Not built yet."));
}
