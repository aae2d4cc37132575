// The Rolter dashboard (issue 15): sign-in, the org selector, the pages, and the connection banner.
// Everything it shows or changes goes through /api/v1 (api.js); pages are addressed by the URL's fragment
// ("#/providers/edit/vllm-3"), which never holds the token.

import { api, session, on, APIError, Unreachable, describe } from "./api.js";
import { h, replace, clock } from "./dom.js";
import { providersList, providerSheet } from "./providers.js";
import { routesList, routeSheet, docsBase } from "./routes.js";
import { fleetPage } from "./fleet.js";
import { keysPage } from "./keys.js";
import { auditPage } from "./audit.js";
import { usagePage } from "./usage.js";

const $ = (id) => document.getElementById(id);
const ORG = "rolter.org"; // the org last picked, in sessionStorage beside the token

const state = {
  info: null,
  orgs: [],
  org: "",
  strategies: null,
  started: false,
  gen: 0, // bumped at every navigation: a page still loading for an older one does not show
  stop: null, // stops the current page's timers (Fleet)
  navigated: false,
};

// --- connection and session -------------------------------------------------------------------------

let downSince = null;
let lastAnswer = 0; // Date.now() of the last answer of the control plane, whatever its status
on("reachable", (ok) => {
  const el = $("conn");
  if (ok) {
    lastAnswer = Date.now();
    downSince = null;
    el.hidden = true;
    el.textContent = "";
    document.body.classList.remove("offline");
    return;
  }
  downSince = downSince || new Date();
  el.textContent = `Control plane unreachable since ${clock(downSince)}. What is shown may be out of date, and nothing can be saved until it answers.`;
  el.hidden = false;
  document.body.classList.add("offline");
});

// The heartbeat: a page that does not poll (all but Fleet) still learns that the control plane went away,
// or came back, within HEARTBEAT_MS, instead of showing stale data as if it were current. It asks only
// when nothing else has had an answer lately.
const HEARTBEAT_MS = 5000;
setInterval(async () => {
  if (!state.started || document.visibilityState === "hidden" || Date.now() - lastAnswer < HEARTBEAT_MS) return;
  try {
    await api("GET", "/info");
  } catch {
    // api() has raised the banner (unreachable) or signed out (401); nothing more to do here.
  }
}, HEARTBEAT_MS);

// A control plane without a superadmin token runs open on loopback (docs/api/control-plane.md): a caller with
// no token is the superadmin. The dashboard first tries without one when it has none (probing), and asks
// for the token only when that is refused.
let probing = false;
// Requests in flight together (start's, or a Fleet poll and the heartbeat) can all be refused: only the
// first 401 of a session attempt signs out and says why.
let attempt = 0, refusedAttempt = -1;
on("unauthorized", () => {
  if (refusedAttempt === attempt) return;
  refusedAttempt = attempt;
  const msg = session.token() ? "The control plane refused the token (invalid or revoked): sign in again."
    : probing ? "" : "This control plane needs a token.";
  signOut(msg);
});

function stopPage() {
  if (state.stop) state.stop();
  state.stop = null;
  state.gen++;
}

function showLogin(message, canRetry = false) {
  stopPage();
  state.started = false;
  $("app").hidden = true;
  $("login").hidden = false;
  const err = $("login-error");
  err.textContent = message || "";
  err.hidden = !message;
  $("retry").hidden = !canRetry;
  $("token").value = "";
  $("token").focus();
  document.title = "Sign in · Rolter";
}

function signOut(message) {
  session.clear();
  sessionStorage.removeItem(ORG);
  replace($("main"));
  showLogin(message);
}

async function loadStrategies() {
  let resp;
  try {
    resp = await fetch("strategies.json", { cache: "no-cache", credentials: "omit" });
  } catch {
    throw new Unreachable("the control plane is unreachable");
  }
  if (!resp.ok) throw new Error(`cannot load strategies.json: HTTP ${resp.status}`);
  return resp.json();
}

// start checks the token by reading what every page needs, then shows the page the URL names.
async function start() {
  const [info, orgs, strategies] = await Promise.all([api("GET", "/info"), api("GET", "/orgs"), loadStrategies()]);
  state.info = info.data;
  state.orgs = orgs.data.data;
  state.strategies = strategies;
  const saved = sessionStorage.getItem(ORG);
  const writable = state.orgs.filter((o) => !o.read_only);
  state.org = state.orgs.some((o) => o.id === saved) ? saved : (writable[0] || state.orgs[0] || { id: "" }).id;
  renderShell();
  $("login").hidden = true;
  $("app").hidden = false;
  state.started = true;
  await route();
}

async function trySession(onError) {
  attempt++;
  try {
    await start();
  } catch (err) {
    if (err instanceof APIError && err.status === 401) return; // signed out by the "unauthorized" listener
    onError(err);
  }
}

// --- the shell: org selector, navigation, footer ----------------------------------------------------

function orgLabel(o, all) {
  if (o.read_only) return `${o.name} (read-only)`;
  return all.filter((x) => x.name === o.name).length > 1 ? `${o.name} (${o.id})` : o.name;
}

function renderShell() {
  const sel = $("org");
  replace(sel, state.orgs.map((o) => h("option", { value: o.id }, orgLabel(o, state.orgs))));
  sel.value = state.org;
  sel.disabled = state.orgs.length < 2;
  $("new-org").hidden = !state.info.superadmin;
  const org = state.orgs.find((o) => o.id === state.org);
  $("whoami").textContent = !state.info.superadmin ? `admin of ${org ? org.name : state.org}`
    : session.token() ? "superadmin" : "superadmin (open: this control plane has no token)";
  renderFooter();
}

function renderFooter() {
  const base = docsBase(state.info);
  const docs = base ? base + "/" : "";
  replace($("footer"), `Rolter ${state.info.version}`,
    docs ? [" · ", h("a", { href: docs, id: "docs-home" }, "documentation")] : null);
}

function markNav(page) {
  for (const a of document.querySelectorAll("#nav a")) {
    if (a.dataset.page === page) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

function context() {
  const gen = state.gen;
  const org = state.orgs.find((o) => o.id === state.org);
  return {
    org: state.org,
    orgs: state.orgs,
    readOnly: !org || org.read_only,
    superadmin: state.info.superadmin,
    info: state.info,
    strategies: state.strategies,
    // show puts a page's content in <main>, unless the user has navigated on meanwhile.
    show: (el) => {
      if (gen !== state.gen) return;
      replace($("main"), el);
      if (state.navigated) {
        state.navigated = false;
        const heading = $("main").querySelector("h1[tabindex], h2[tabindex]");
        if (heading) heading.focus();
      }
    },
  };
}

const TITLES = { providers: "Providers", routes: "Routes", fleet: "Fleet", keys: "Keys", usage: "Usage", audit: "Audit log" };

async function route() {
  if (!state.started) return;
  const hash = location.hash;
  if (!hash.startsWith("#/")) {
    if (hash === "" || hash === "#") location.replace("#/providers");
    return;
  }
  let parts;
  try {
    parts = hash.slice(2).split("/").map(decodeURIComponent);
  } catch {
    location.replace("#/providers");
    return;
  }
  const page = parts[0];
  if (!TITLES[page]) {
    location.replace("#/providers");
    return;
  }
  stopPage();
  markNav(page);
  document.title = `${TITLES[page]} · Rolter`;
  const ctx = context();
  const name = parts[1] === "edit" ? parts.slice(2).join("/") : undefined;
  switch (page) {
    case "providers":
      if (parts[1] === "new" && !ctx.readOnly) await providerSheet(ctx);
      else if (name !== undefined) await providerSheet(ctx, name);
      else await providersList(ctx);
      break;
    case "routes":
      if (parts[1] === "new" && !ctx.readOnly) await routeSheet(ctx);
      else if (name !== undefined) await routeSheet(ctx, name);
      else await routesList(ctx);
      break;
    case "fleet":
      state.stop = fleetPage(ctx);
      break;
    case "keys":
      await keysPage(ctx);
      break;
    case "usage":
      await usagePage(ctx);
      break;
    case "audit":
      await auditPage(ctx);
      break;
  }
}

// --- wiring -----------------------------------------------------------------------------------------

$("login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const token = $("token").value.trim();
  $("token").value = "";
  probing = false;
  if (token) session.set(token);
  await trySession((err) => {
    session.clear();
    showLogin(err instanceof Unreachable ? "The control plane is unreachable: try again when it answers." : "Cannot sign in: " + describe(err));
  });
});

$("retry").addEventListener("click", () => trySession((err) => showLogin("Still cannot reach the control plane: " + describe(err), true)));

$("logout").addEventListener("click", () => signOut("Signed out: the token is gone from this tab."));

$("skip").addEventListener("click", (ev) => {
  ev.preventDefault(); // the fragment addresses pages: the skip link moves focus, not the URL
  $("main").focus();
});

$("org").addEventListener("change", () => {
  state.org = $("org").value;
  sessionStorage.setItem(ORG, state.org);
  renderShell();
  const page = location.hash.slice(2).split("/")[0] || "providers";
  state.navigated = true;
  if (location.hash === `#/${page}`) route();
  else location.hash = `#/${page}`; // an open sheet belongs to the previous org
});

$("new-org-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const err = $("new-org-error");
  err.hidden = true;
  const input = $("new-org-name");
  try {
    const { data } = await api("POST", "/orgs", { name: input.value.trim() });
    input.value = "";
    input.removeAttribute("aria-invalid");
    $("new-org").open = false;
    const { data: orgs } = await api("GET", "/orgs");
    state.orgs = orgs.data;
    state.org = data.id;
    sessionStorage.setItem(ORG, state.org);
    renderShell();
    state.navigated = true;
    route();
  } catch (e) {
    err.textContent = e instanceof APIError && e.fields.length ? e.fields.map((f) => f.message).join("; ") : describe(e);
    err.hidden = false;
    input.setAttribute("aria-invalid", "true");
    input.focus();
  }
});

window.addEventListener("hashchange", () => {
  state.navigated = true;
  route();
});

// With a token from this tab's session, or none (an open control plane needs none), go straight in; a 401
// shows the sign-in form.
$("login").hidden = true;
probing = !session.token(); // until the user signs in: a refusal of no token is no error of theirs
trySession((err) => showLogin(
  err instanceof Unreachable ? `The control plane is unreachable (since ${clock(downSince || new Date())}).` : "Cannot load the dashboard: " + describe(err),
  err instanceof Unreachable));
