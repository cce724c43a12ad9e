// The admin API, called with the console's session cookie (sent by the browser, HttpOnly) and, on
// every mutation, the CSRF token the sign-in answered. Paths are the API's own ("/admin/v1/...");
// the prefix a proxy serves the admin port under is put in front here and nowhere else.

export const PREFIX = document.querySelector('meta[name="bae-prefix"]').content;

let csrfToken = "";

export function setCsrfToken(token) {
  csrfToken = token;
}

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

export function url(path) {
  return PREFIX + path;
}

export async function api(path, { method = "GET", body, headers = {} } = {}) {
  const init = { method, headers: { ...headers }, credentials: "same-origin", cache: "no-store" };
  if (method !== "GET" && method !== "HEAD") init.headers["X-CSRF-Token"] = csrfToken;
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  const response = await fetch(url(path), init);
  const text = await response.text();
  let value = null;
  if (text) {
    try {
      value = JSON.parse(text);
    } catch {
      value = { detail: text };
    }
  }
  if (!response.ok) {
    if (response.status === 401) window.dispatchEvent(new CustomEvent("bae:signed-out"));
    throw new ApiError(response.status, value || {});
  }
  return value;
}

// Every item of a paginated admin list, following its cursors (at most `limit` items).
export async function allPages(path, limit = 1000) {
  const items = [];
  let cursor = "";
  do {
    const sep = path.includes("?") ? "&" : "?";
    const page = await api(cursor ? `${path}${sep}cursor=${encodeURIComponent(cursor)}` : path);
    items.push(...page.items);
    cursor = page.next_cursor || "";
  } while (cursor && items.length < limit);
  return items;
}
