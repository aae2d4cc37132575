// The dashboard's only way to the control plane: /api/v1, with the admin token as a bearer token.
//
// The token lives in this tab's sessionStorage (gone when the tab closes), is sent only in the
// Authorization header, and is never put in a URL, a log or the page.

const TOKEN = "rolter.token";
const BASE = "../api/v1"; // relative to /dashboard/, so a path prefix in front of the control plane works

export const session = {
  token: () => sessionStorage.getItem(TOKEN) || "",
  set: (t) => sessionStorage.setItem(TOKEN, t),
  clear: () => sessionStorage.removeItem(TOKEN),
};

// APIError is an answer other than 2xx, in the API's error shape: {message, type, code, fields, problems}.
export class APIError extends Error {
  constructor(status, e) {
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || "";
    this.fields = e.fields || [];
    this.problems = e.problems || [];
  }
}

// Unreachable is a request that got no answer: the control plane is down or the network is.
export class Unreachable extends Error {}

const listeners = { unauthorized: [], reachable: [] };

// on subscribes fn to "unauthorized" (a 401: the token is gone or revoked) or "reachable" (true after
// any answer, false after a request that got none).
export function on(event, fn) {
  listeners[event].push(fn);
}

function emit(event, arg) {
  for (const fn of listeners[event]) fn(arg);
}

// api calls method path ("/orgs", already escaped) with body (undefined for none) and returns
// {status, etag, data}; it throws APIError for an answer other than 2xx and Unreachable for none.
export async function api(method, path, body, headers = {}) {
  const h = { Accept: "application/json", ...headers };
  const token = session.token();
  if (token) h.Authorization = "Bearer " + token;
  if (body !== undefined) h["Content-Type"] = "application/json";
  let resp;
  try {
    resp = await fetch(BASE + path, {
      method,
      headers: h,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
      redirect: "error",
    });
  } catch (err) {
    emit("reachable", false);
    throw new Unreachable("the control plane is unreachable");
  }
  emit("reachable", true);
  const text = await resp.text().catch(() => "");
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!resp.ok) {
    const err = new APIError(resp.status, (data && data.error) || { message: `HTTP ${resp.status} ${resp.statusText}` });
    if (resp.status === 401) emit("unauthorized", err);
    throw err;
  }
  return { status: resp.status, etag: resp.headers.get("ETag"), data };
}

// path joins escaped path segments: path("orgs", org, "providers") -> "/orgs/org_x/providers".
export function path(...segments) {
  return "/" + segments.map(encodeURIComponent).join("/");
}

// describe is a one-line account of an error for the page.
export function describe(err) {
  if (err instanceof Unreachable) return "The control plane is unreachable.";
  if (err instanceof APIError) return err.message;
  return String(err && err.message ? err.message : err);
}
