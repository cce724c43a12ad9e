import { h } from "../dom.js";

export async function render(main) {
  main.append(h("h1", {}, "usage"), h("p", {}, "Not built yet."));
}
