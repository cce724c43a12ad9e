// The console's entry: sign-in, then a hash router over the pages (js/pages/*.js). Each page module
// exports `render(main, params)`, which fills `main` and may return a function that stops what the
// page started (a stream, a timer) when another page is shown.

import { api, setCsrfToken, PREFIX } from "./api.js";
import { h, clear, errorBlock } from "./dom.js";

const ROUTES = [
  [/^#\/sessions\/([^/]+)$/, () => import("./pages/session.js")],
  [/^#\/sessions(?:\?.*)?$/, () => import("./pages/sessions.js")], // the query: the list's filters
  [/^#\/profiles$/, () => import("./pages/profiles.js")],
  [/^#\/keys$/, () => import("./pages/keys.js")],
  [/^#\/schedules$/, () => import("./pages/schedules.js")],
  [/^#\/triggers$/, () => import("./pages/triggers.js")],
  [/^#\/webhooks$/, () => import("./pages/webhooks.js")],
  [/^#\/sandboxes$/, () => import("./pages/sandboxes.js")],
  [/^#\/usage$/, () => import("./pages/usage.js")],
  [/^#\/config$/, () => import("./pages/config.js")],
];

const main = document.getElementById("main");
const nav = document.getElementById("nav");
let stopPage = null;
let signedIn = false;

async function show() {
  if (stopPage) {
    stopPage();
    stopPage = null;
  }
  if (!signedIn) return;
  const hash = location.hash || "#/sessions";
  for (const [pattern, load] of ROUTES) {
    const match = hash.match(pattern);
    if (!match) continue;
    for (const link of nav.querySelectorAll("a")) {
      link.toggleAttribute("aria-current", hash.startsWith(link.getAttribute("href")));
    }
    const page = await load();
    clear(main);
    try {
      stopPage = (await page.render(main, match.slice(1).map(decodeURIComponent))) || null;
    } catch (error) {
      main.append(errorBlock(error));
    }
    main.focus();
    return;
  }
  location.hash = "#/sessions";
}

function signInForm(problem) {
  nav.hidden = true;
  const token = h("input", { id: "admin-token", type: "password", autocomplete: "off", required: true });
  const form = h(
    "form",
    { id: "sign-in", class: "card" },
    h("h1", {}, "Sign in"),
    h("p", {}, "Paste the admin key (bae_admin_…). It is exchanged for a session cookie and not kept by the page."),
    h("label", { for: "admin-token" }, "Admin key"),
    token,
    h("button", { type: "submit" }, "Sign in"),
    problem ? errorBlock(problem) : null,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      await signedInWith(await api("/console/sign-in", { method: "POST", body: { token: token.value } }));
    } catch (error) {
      token.value = "";
      signInForm(error);
    }
  });
  clear(main).append(form);
  token.focus();
}

async function signedInWith(session) {
  setCsrfToken(session.csrf_token);
  signedIn = true;
  nav.hidden = false;
  await show();
}

function signedOut(problem) {
  signedIn = false;
  setCsrfToken("");
  if (stopPage) stopPage();
  stopPage = null;
  signInForm(problem);
}

// A sign-in link (`baectl console`) carries a one-time token in the fragment, which never reaches the
// server's logs; it is taken off the address bar before anything else happens. It may arrive with the
// page's first load or, in a console already open, as a change of the fragment.
function linkInAddress() {
  return new URLSearchParams(location.hash.slice(1)).get("link");
}

async function signInWithLink(link) {
  history.replaceState(null, "", `${PREFIX}/console/#/sessions`);
  try {
    await signedInWith(await api("/console/sign-in/link", { method: "POST", body: { link } }));
  } catch (error) {
    signedOut(error);
  }
}

async function start() {
  const link = linkInAddress();
  if (link) return signInWithLink(link);
  try {
    await signedInWith(await api("/console/session"));
  } catch {
    signInForm(null);
  }
}

document.getElementById("sign-out").addEventListener("click", async () => {
  try {
    await api("/console/sign-out", { method: "POST" });
  } finally {
    signedOut(null);
  }
});
window.addEventListener("bae:signed-out", () => {
  if (signedIn) signedOut(new Error("Your console session ended; sign in again."));
});
window.addEventListener("hashchange", () => {
  const link = linkInAddress();
  return link ? signInWithLink(link) : show();
});
start();
