// Fleet: the gateway's live state (GET /api/v1/state), polled every 2 s and when the window regains focus.
// Per route and target: in flight, finished requests and their rate, the engine's queue, eligibility and
// why, the prefix trie, the KV index and its stream, the delivered cache hits; the route's decisions by
// reason; for a prefill/decode-disaggregated route, its protocol and hops and its two pools apart (the
// targets are the prefill pool, ranked by the strategy; the decode pool is chosen by load); for a route whose
// [routes.lora] serves adapters, each engine's adapters and one row per adapter route (its home set, holders
// and loads) below the base route, the adapter routes having no section of their own; and a chart of
// requests per second per target over the last minutes, from successive `requests` counts (the base
// routes' targets). Then the discovery sources, for the superadmin: each one's health and endpoints.

import { api, describe, APIError } from "./api.js";
import { h, svg, replace, clock } from "./dom.js";

const POLL_MS = 2000;
const WINDOW_MS = 5 * 60 * 1000;
const SERIES = 8; // colours in dashboard.css (.s0 ... .s7); more targets share them
// A base route's adapters start unfolded up to this many; past it the summary line stands for them.
const OPEN_ADAPTERS = 8;

// The rate history outlives the page: leaving Fleet and coming back keeps the chart.
const last = new Map(); // target key -> {t, requests}
const rates = new Map(); // target key -> [{t, rate}]
// Whether the user unfolded or folded a base route's adapters (base model -> open), kept across polls.
const adaptersOpen = new Map();

// key names a target's rate history; a decode target apart from the same engine in the prefill pool.
const key = (route, t, pool) => `${route.model}\u0000${t.provider}\u0000${t.model}${pool === "decode" ? "\u0000decode" : ""}`;

// pools are a route's targets by pool: one unnamed pool, or a disaggregated route's prefill and decode.
function pools(route) {
  if (!route.disaggregation) return [{ pool: null, targets: route.targets }];
  return [{ pool: "prefill", targets: route.targets }, { pool: "decode", targets: route.disaggregation.decode }];
}

// requestCounts returns every target's finished requests by rate-history key. A base route's target
// counts its adapter routes' requests on the same replica too: the replica's whole traffic.
function requestCounts(state) {
  const n = new Map();
  for (const route of state.routes) {
    for (const { pool, targets } of pools(route)) {
      for (const t of targets) n.set(key(route, t, pool), t.requests);
    }
  }
  for (const route of state.routes) {
    const base = route.lora && state.routes.find((r) => !r.lora && r.model === route.lora.base);
    if (!base) continue;
    for (const t of route.targets) {
      const bt = base.targets.find((b) => b.provider === t.provider);
      if (bt) n.set(key(base, bt, null), n.get(key(base, bt, null)) + t.requests);
    }
  }
  return n;
}

// adapterRequests returns the requests of a base route's adapter routes by replica (provider).
function adapterRequests(adapters) {
  const n = new Map();
  for (const route of adapters) {
    for (const t of route.targets) n.set(t.provider, (n.get(t.provider) || 0) + t.requests);
  }
  return n;
}

// record adds one poll's counts to the history. A count that went down (the route's series began anew,
// at a reload that changed it) starts the target over rather than plotting a negative rate.
function record(state, now) {
  for (const [k, requests] of requestCounts(state)) {
    const prev = last.get(k);
    last.set(k, { t: now, requests });
    if (!prev || requests < prev.requests || now <= prev.t) continue;
    const series = rates.get(k) || [];
    series.push({ t: now, rate: (requests - prev.requests) / ((now - prev.t) / 1000) });
    rates.set(k, series);
  }
  for (const [k, series] of rates) {
    while (series.length && series[0].t < now - WINDOW_MS) series.shift();
    if (!series.length) rates.delete(k);
  }
}

function currentRate(k) {
  const series = rates.get(k);
  return series && series.length ? series[series.length - 1].rate : null;
}

const fmtRate = (r) => (r === null ? "—" : r < 10 ? r.toFixed(1) : r.toFixed(0));

export function fleetPage(ctx) {
  const status = h("p", { class: "fleet-status", id: "fleet-status" }, "Loading the live state…");
  const content = h("div", { id: "fleet" });
  ctx.show(h("section", {},
    h("div", { class: "page-head" }, h("h1", { tabindex: "-1" }, "Fleet"),
      h("button", { type: "button", id: "fleet-refresh", onclick: () => poll() }, "Refresh now")),
    h("p", { class: "hint" }, "Live: refreshes every 2 seconds and when this window regains focus. " +
      "Every route the token can see; the names are the gateway's."),
    status, content));

  let stopped = false;
  let busy = false;
  let lastOK = null; // time of the last state shown
  let failingSince = null;

  const poll = async () => {
    if (stopped || busy) return;
    busy = true;
    try {
      const { data } = await api("GET", "/state");
      if (stopped) return;
      const now = Date.now();
      record(data, now);
      lastOK = new Date(now);
      failingSince = null;
      content.classList.remove("stale");
      status.classList.remove("error");
      // The store's generation, as the Audit page numbers changes; the gateway's own reload count apart.
      status.textContent = `Updated ${clock(lastOK)} · store generation ${data.store_generation} · gateway config ${data.generation}`;
      render(ctx, content, data, now);
    } catch (err) {
      if (stopped || (err instanceof APIError && err.status === 401)) return;
      failingSince = failingSince || new Date();
      content.classList.add("stale");
      status.classList.add("error");
      const what = err instanceof APIError ? `the control plane answered an error since ${clock(failingSince)}: ${describe(err)}`
        : `Control plane unreachable since ${clock(failingSince)}`;
      status.textContent = lastOK ? `${what}; the numbers below are from ${clock(lastOK)}.` : `${what}.`;
    } finally {
      busy = false;
    }
  };
  const onFocus = () => poll();
  const onVisible = () => {
    if (document.visibilityState === "visible") poll();
  };
  const timer = setInterval(poll, POLL_MS);
  window.addEventListener("focus", onFocus);
  document.addEventListener("visibilitychange", onVisible);
  poll();
  return () => {
    stopped = true;
    clearInterval(timer);
    window.removeEventListener("focus", onFocus);
    document.removeEventListener("visibilitychange", onVisible);
  };
}

function render(ctx, content, state, now) {
  const sources = (state.sources || []).map(sourceSection);
  if (!state.routes.length) {
    replace(content, h("p", { class: "empty" }, "No routes serve yet."), sources);
    return;
  }
  const orgName = (id) => (id ? (ctx.orgs.find((o) => o.id === id) || { name: id }).name : "rolter.toml");
  const keys = [];
  const adapters = adapterRoutes(state.routes);
  const sections = state.routes.filter((route) => !route.lora)
    .map((route) => routeSection(route, keys, orgName, adapters.get(route.model)));
  // Adapter routes whose base route this view lacks still show, under their base model's name.
  for (const [base, routes] of adapters) {
    if (state.routes.some((route) => !route.lora && route.model === base)) continue;
    sections.push(h("section", { class: "route-state", "data-lora-base": base },
      h("h2", {}, base, h("span", { class: "sub" }, " · its adapters only (the base route is not in this view)")),
      loraAdapters(base, routes)));
  }
  replace(content, chart(keys, now, content.clientWidth), sections, sources);
}

// adapterRoutes groups the adapter routes ([routes.lora] makes one per adapter) by their base route's
// model, in the state's order.
function adapterRoutes(routes) {
  const by = new Map();
  for (const route of routes) {
    if (!route.lora) continue;
    if (!by.has(route.lora.base)) by.set(route.lora.base, []);
    by.get(route.lora.base).push(route);
  }
  return by;
}

// routeSection is one route with its pools, decisions and delivered hits, and the adapter routes it is the
// base of; its targets join keys, the chart's series.
function routeSection(route, keys, orgName, adapters) {
  const decisions = Object.entries(route.decisions).sort((a, b) => b[1] - a[1]);
  const lora = {
    column: pools(route).some(({ targets }) => targets.some((t) => t.adapters)),
    requests: adapters ? adapterRequests(adapters) : null,
  };
  const columns = lora.column ? [...COLUMNS, "Adapters"] : COLUMNS;
  const tables = pools(route).map(({ pool, targets }) => {
    const rows = targets.map((t) => {
      const k = key(route, t, pool);
      keys.push({ k, label: `${route.model}: ${shortName(route, t.provider)}${pool ? ` (${pool})` : ""}` });
      return targetRow(route, t, pool, k, keys.length - 1, lora);
    });
    const caption = pool === "prefill" ? h("caption", { class: "pool" }, "Prefill pool", h("span", { class: "sub" }, ` · ranked by ${route.strategy}`))
      : pool === "decode" ? h("caption", { class: "pool" }, "Decode pool", h("span", { class: "sub" }, " · chosen by load"))
        : null;
    return h("div", { class: "table-wrap" }, h("table", { class: "cards", "data-pool": pool },
      caption,
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: columns.length, "data-label": "" }, "No targets yet.")))));
  });
  const n = adapters ? adapters.length : 0;
  return h("section", { class: "route-state", "data-route": route.model },
    h("h2", {}, route.model, h("span", { class: "sub" },
      ` · ${route.strategy}${route.disaggregation ? ` · disaggregated (${route.disaggregation.protocol})` : ""}` +
      `${n ? ` · ${n} LoRA adapter${n === 1 ? "" : "s"}` : ""} · ${orgName(route.org)}`)),
    route.disaggregation ? disaggSummary(route.disaggregation) : null,
    tables,
    h("p", { class: "decisions", "data-col": "decisions" }, "Decisions by reason: ",
      decisions.length ? decisions.map(([r, c]) => `${r} ${c}`).join(" · ") : "none yet"),
    h("p", { class: "ratio", "data-col": "hit-ratio" }, hitRatio(route)),
    n ? loraAdapters(route.model, adapters) : null);
}

const COLUMNS = ["Target", "Weight", "In flight", "Requests", "Req/s", "Engine queue", "Eligible", "Trie", "KV index", "Cache hits"];

// targetRow is one target of a route's pool (null for a route with one pool); k is its rate history and
// i its colour in the chart. lora.column adds the engine's LoRA adapters; lora.requests, for a base route,
// are its adapter routes' requests by replica, counted in the target's requests and rate.
function targetRow(route, t, pool, k, i, lora) {
  const ofAdapters = lora.requests && !pool ? lora.requests.get(t.provider) || 0 : null;
  const cell = (col, label, value) => h("td", { "data-col": col, "data-label": label }, value);
  return h("tr", { "data-route": route.model, "data-provider": t.provider, "data-pool": pool },
    // One span in the cell: a narrow window lays a cell out as a grid of label and value.
    h("th", { scope: "row", "data-label": "Target" },
      h("span", {}, swatch(i), shortName(route, t.provider), h("span", { class: "sub" }, ` → ${t.model}`))),
    cell("weight", "Weight", String(t.weight)),
    cell("inflight", "In flight", String(t.inflight)),
    cell("requests", "Requests", ofAdapters === null ? String(t.requests)
      : h("span", {}, String(t.requests + ofAdapters), h("span", { class: "sub" }, ` · ${ofAdapters} of adapters`))),
    cell("rate", "Req/s", fmtRate(currentRate(k))),
    cell("engine", "Engine queue", t.engine_running === undefined ? "—" : `${t.engine_running} running, ${t.engine_waiting} waiting`),
    cell("eligible", "Eligible", t.eligible ? "yes" : `no: ${t.why || "unknown"}`),
    cell("trie", "Trie", t.trie_nodes === undefined ? "—" : `${t.trie_nodes} nodes, ${t.trie_edge_bytes} bytes`),
    cell("kv", "KV index", t.kv_blocks === undefined ? "—"
      : `${t.kv_blocks} blocks, stream ${t.kv_trusted ? "trusted" : "untrusted"}${t.kv_reason && t.kv_reason !== "none" ? ` (${t.kv_reason})` : ""}`),
    cell("hits", "Cache hits", targetHits(t)),
    lora.column ? cell("adapters", "Adapters", t.adapters ? engineAdapters(t.adapters) : "—") : null);
}

// engineAdapters is what an engine reports of its LoRA adapters: those its batch runs and those waiting
// for one of its slots (max_lora present: the batch is known, and an absent list is empty), and how many
// its /v1/models lists.
function engineAdapters(a) {
  const list = (names) => (names && names.length ? names.join(", ") : "none");
  const batch = a.max_lora === undefined ? "batch unknown"
    : `running ${list(a.running)} · waiting ${list(a.waiting)}${a.max_lora > 0 ? ` · ${a.max_lora} slot${a.max_lora === 1 ? "" : "s"}` : ""}`;
  return `${batch} · ${a.registered ? `${a.registered.length} registered` : "none listed"}`;
}

const ADAPTER_COLUMNS = ["Adapter", "k", "Home set", "Holders", "In flight", "Requests", "Req/s", "Dynamic loads"];

// loraAdapters is what the adapter routes of base add below it: a summary line, then one row per adapter,
// folded from the start when there are many; the user's unfolding or folding holds across polls.
function loraAdapters(base, routes) {
  const n = routes.length;
  const held = routes.filter((r) => r.lora.holders.length).length;
  const inflight = routes.reduce((sum, r) => sum + r.lora.inflight, 0);
  const dynamic = routes.filter((r) => r.lora.dynamic).length;
  const loading = dynamic === 0 ? "dynamic loading off" : dynamic === n ? "dynamic loading on" : `dynamic loading on for ${dynamic}`;
  const open = adaptersOpen.has(base) ? adaptersOpen.get(base) : n <= OPEN_ADAPTERS;
  return h("details", { class: "lora", "data-lora-base": base, open, ontoggle: (e) => adaptersOpen.set(base, e.currentTarget.open) },
    h("summary", { "data-col": "lora-summary" },
      `${n} LoRA adapter${n === 1 ? "" : "s"} of ${base}: ${held} held by a replica, ${inflight} in flight · ${loading}`),
    h("p", { class: "hint" }, "Each adapter is routed within its home set: the first k of the replicas that hold it, " +
      "then the rest in its rendezvous order; k grows with its requests in flight."),
    h("div", { class: "table-wrap" }, h("table", { class: "cards adapters" },
      h("thead", {}, h("tr", {}, ADAPTER_COLUMNS.map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, routes.map(adapterRow)))));
}

// adapterRow is one adapter route: its home set's width and members, its holders (marked where the engine
// reports it running or waiting for a slot), its requests by replica and its dynamic loads.
function adapterRow(route) {
  const l = route.lora;
  const cell = (col, label, value) => h("td", { "data-col": col, "data-label": label }, value);
  const name = (p) => shortName(route, p);
  const engine = new Map(route.targets.map((t) => [t.provider, t.adapters]));
  const holder = (p) => {
    const a = engine.get(p);
    const says = a && (a.running || []).includes(l.adapter) ? " (running)" : a && (a.waiting || []).includes(l.adapter) ? " (waiting)" : "";
    return name(p) + says;
  };
  const total = route.targets.reduce((sum, t) => sum + t.requests, 0);
  const where = route.targets.filter((t) => t.requests > 0).map((t) => `${name(t.provider)} ${t.requests}`);
  const rs = route.targets.map((t) => currentRate(key(route, t, null))).filter((r) => r !== null);
  return h("tr", { "data-route": route.model, "data-lora-base": l.base },
    h("th", { scope: "row", "data-label": "Adapter" }, h("span", {}, l.adapter)),
    cell("k", "k", `${l.k} (${l.k_min}–${l.k_max})`),
    h("td", { "data-col": "home", "data-label": "Home set", title: `Rendezvous order: ${l.order.map(name).join(", ")}` },
      l.home.length ? l.home.map(name).join(", ") : "none eligible"),
    cell("holders", "Holders", l.holders.length ? l.holders.map(holder).join(", ") : "none"),
    cell("inflight", "In flight", String(l.inflight)),
    cell("requests", "Requests", h("span", {}, String(total), where.length ? h("span", { class: "sub" }, ` · ${where.join(", ")}`) : null)),
    cell("rate", "Req/s", fmtRate(rs.length ? rs.reduce((a, b) => a + b, 0) : null)),
    cell("loads", "Dynamic loads", l.dynamic ? `${l.loads} ok, ${l.load_failures} failed` : "off"));
}

// disaggSummary is what a disaggregated route adds above its pools: how the two engines of a request are
// paired, which prompts skip the prefill pool, and what became of the hops.
function disaggSummary(pd) {
  const how = pd.protocol === "sglang"
    ? `SGLang: prefill and decode engine at once, bootstrap port ${pd.bootstrap_port ? pd.bootstrap_port : "none"}`
    : "vLLM: the prefill engine first, its KV transfer params to the decode engine";
  const skip = pd.prefill_threshold_tokens > 0
    ? `prompts under ${pd.prefill_threshold_tokens} tokens skip the prefill pool`
    : "every prompt goes through the prefill pool";
  const hops = pd.hops;
  return h("div", { class: "disagg" },
    h("p", { "data-col": "disaggregation" }, `Disaggregated, ${how}; ${skip}.`),
    h("p", { "data-col": "hops" }, `Hops: prefill ${hops.prefill_ok} ok, ${hops.prefill_failed} failed · ` +
      `decode ${hops.decode_ok} ok, ${hops.decode_failed} failed · ${pd.reprefills} re-prefill${pd.reprefills === 1 ? "" : "s"} after a failed decode`),
    h("p", { "data-col": "skipped" }, `Decoded without a prefill: ${counts(pd.skipped)} · prefill answers' KV params: ${counts(pd.kv_params)}`));
}

// counts renders a map of counts by name ("short_prompt 3, endpoint 1"), or "none".
function counts(m) {
  const names = Object.keys(m || {}).sort();
  return names.length ? names.map((k) => `${k} ${m[k]}`).join(", ") : "none";
}

// sourceSection is one discovery source ([[sources]], the superadmin's view only): whether its last
// report was its set or a failure (the last set then stands), and every endpoint it sees with its state.
function sourceSection(src) {
  const when = (t) => (t ? clock(new Date(t)) : "never");
  const health = src.up ? `up, last set ${when(src.last_sync)}`
    : `failing since ${when(src.last_error_at)}: ${src.last_error || "no answer yet"}; the last set stands`;
  const counts = Object.entries(src.states).filter(([, n]) => n > 0).map(([st, n]) => `${n} ${st.replace("_", " ")}`);
  const rows = src.endpoints.map((e) => h("tr", { "data-source": src.name, "data-provider": e.provider, "data-state": e.state },
    h("th", { scope: "row", "data-label": "Target" }, h("span", {}, e.provider)),
    h("td", { "data-label": "Address" }, e.address),
    h("td", { "data-label": "Name" }, e.name || "—"),
    h("td", { "data-label": "State", "data-col": "state" }, e.state.replace("_", " "))));
  return h("section", { class: "route-state source-state", "data-source": src.name },
    h("h2", {}, src.name, h("span", { class: "sub" }, ` · ${src.kind} source · ${counts.join(", ") || "no endpoints"}`)),
    h("p", { class: src.up ? "source-health" : "source-health error", "data-col": "source-health" }, health),
    src.apply_error ? h("p", { class: "error" }, `The gateway refused the config with these endpoints: ${src.apply_error}`) : null,
    rows.length ? h("div", { class: "table-wrap" }, h("table", { class: "cards" },
      h("thead", {}, h("tr", {}, ["Target", "Address", "Name", "State"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, rows))) : null);
}

// Delivered cache hits: the engines' own usage.prompt_tokens_details.cached_tokens over usage.prompt_tokens
// of the 2xx responses that reported both (usage_measured); the others (usage_unmeasured: a stream without
// stream_options.include_usage, an engine without prompt token details) are not counted as zero reuse.
// A gateway whose state view has no usage fields shows that it does not report them.
const pct = (part, whole) => (whole > 0 ? `${((100 * part) / whole).toFixed(1)}%` : "0%");

function targetHits(t) {
  if (typeof t.usage_measured !== "number") return "—";
  if (t.usage_measured === 0) return t.usage_unmeasured > 0 ? "not measured" : "—";
  return pct(t.cached_tokens, t.prompt_tokens);
}

function hitRatio(route) {
  let measured = 0, unmeasured = 0, prompt = 0, cached = 0, reported = false;
  for (const t of route.targets) {
    if (typeof t.usage_measured !== "number") continue;
    reported = true;
    measured += t.usage_measured;
    unmeasured += t.usage_unmeasured || 0;
    prompt += t.prompt_tokens || 0;
    cached += t.cached_tokens || 0;
  }
  if (!reported) return "Delivered cache hits: not reported by this gateway's state view.";
  if (measured === 0) {
    return unmeasured > 0
      ? `Delivered cache hits: not measured: none of ${unmeasured} responses reported cached tokens (a stream needs stream_options.include_usage).`
      : "Delivered cache hits: no responses yet.";
  }
  return `Delivered cache hits: ${pct(cached, prompt)} of ${prompt} prompt tokens, over ${measured} measured responses` +
    (unmeasured > 0 ? `; ${unmeasured} more reported no cached tokens.` : ".");
}

// shortName is a provider as its route's org knows it ("org_x/p" -> "p").
function shortName(route, provider) {
  return route.org && provider.startsWith(route.org + "/") ? provider.slice(route.org.length + 1) : provider;
}

function swatch(i) {
  return h("span", { class: `swatch s${i % SERIES}`, "aria-hidden": "true" });
}

// chart draws requests per second per target over the last minutes: from the oldest rate it has (at least
// one minute back) up to five minutes. width is the room it has, in CSS pixels: the drawing is made that
// wide, so its text keeps its size in a narrow window.
function chart(keys, now, width) {
  const W = Math.max(300, Math.min(1100, Math.round(width || 640) - 20)), H = 180, L = 44, R = 8, T = 10, B = 24;
  let max = 1, oldest = now;
  for (const { k } of keys) {
    for (const p of rates.get(k) || []) {
      max = Math.max(max, p.rate);
      oldest = Math.min(oldest, p.t);
    }
  }
  max = niceCeil(max);
  const span = Math.min(WINDOW_MS, Math.max(60 * 1000, Math.ceil((now - oldest) / 60000) * 60000));
  const minutes = Math.round(span / 60000);
  const x = (t) => L + ((t - (now - span)) / span) * (W - L - R);
  const y = (r) => T + (1 - r / max) * (H - T - B);
  let peak = 0; // the highest rate plotted, before rounding for the axis (data-peak: tests read it)
  const lines = keys.map(({ k }, i) => {
    const series = rates.get(k) || [];
    if (!series.length) return null;
    for (const p of series) peak = Math.max(peak, p.rate);
    const pts = series.map((p) => `${x(p.t).toFixed(1)},${y(p.rate).toFixed(1)}`);
    const lastP = series[series.length - 1];
    // A dot on the newest point: a series of one point has no line to draw yet.
    return [
      svg("polyline", { class: `series s${i % SERIES}`, points: pts.join(" "), "data-key": k }),
      svg("circle", { class: `dot s${i % SERIES}`, cx: x(lastP.t).toFixed(1), cy: y(lastP.rate).toFixed(1), r: 3 }),
    ];
  });
  const total = keys.reduce((sum, { k }) => sum + (currentRate(k) || 0), 0);
  const label = `Requests per second per target over the last ${minutes} minute${minutes > 1 ? "s" : ""}; now ${fmtRate(total)} in all.`;
  return h("figure", { class: "chart" },
    svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label, id: "fleet-chart", "data-peak": peak.toFixed(3) },
      svg("line", { class: "axis", x1: L, y1: y(0), x2: W - R, y2: y(0) }),
      svg("line", { class: "grid", x1: L, y1: y(max / 2), x2: W - R, y2: y(max / 2) }),
      svg("line", { class: "grid", x1: L, y1: y(max), x2: W - R, y2: y(max) }),
      svg("text", { class: "tick", x: L - 6, y: y(max) + 4, "text-anchor": "end" }, String(max)),
      svg("text", { class: "tick", x: L - 6, y: y(max / 2) + 4, "text-anchor": "end" }, String(max / 2)),
      svg("text", { class: "tick", x: L - 6, y: y(0) + 4, "text-anchor": "end" }, "0"),
      svg("text", { class: "tick", x: L, y: H - 6 }, `−${minutes} min`),
      svg("text", { class: "tick", x: W - R, y: H - 6, "text-anchor": "end" }, "now"),
      lines),
    h("figcaption", {}, h("span", {}, `Requests per second per target, last ${minutes === 1 ? "minute" : minutes + " minutes"}: `),
      h("ul", { class: "legend" }, keys.map(({ label: l }, i) => h("li", {}, swatch(i), l)))));
}

// niceCeil rounds up to 1, 2 or 5 times a power of ten, for the chart's top line.
function niceCeil(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}
