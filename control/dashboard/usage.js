// Usage: what the org's data-plane keys used, by hour: a chart of tokens per hour (prompt, of which cached,
// and completion) and a table per key and model of requests, refused requests and tokens. The superadmin
// sees every org's (or one org's); an org admin token its org's. The control plane stores usage within
// 10 seconds; reading it stores this gateway's first.

import { api, path, describe } from "./api.js";
import { h, svg, replace, table } from "./dom.js";

const HOUR = 3600 * 1000;
const RANGES = [["24", "Last 24 hours"], ["168", "Last 7 days"]];
const KINDS = [["prompt_tokens", "Prompt"], ["cached_tokens", "Cached"], ["completion_tokens", "Completion"]];

export async function usagePage(ctx) {
  const body = h("div", {}, h("p", { class: "loading" }, "Loading the usage…"));
  const narrow = h("input", { type: "checkbox", id: "usage-org-only" });
  const range = h("select", { id: "usage-range" }, RANGES.map(([v, l]) => h("option", { value: v }, l)));
  const org = ctx.orgs.find((o) => o.id === ctx.org);
  const orgName = (id) => (ctx.orgs.find((o) => o.id === id) || { name: id }).name;
  const controls = h("p", { class: "usage-controls" },
    h("label", { for: "usage-range" }, "Range "), range,
    ctx.superadmin && ctx.org !== "file" ? [" ", h("label", { class: "check" }, narrow, ` Only ${org ? org.name : ctx.org}`)] : null);

  const load = async () => {
    const hours = Number(range.value);
    const to = new Date();
    const from = new Date(Math.floor((to.getTime() - (hours - 1) * HOUR) / HOUR) * HOUR);
    const q = (group) => `?from=${encodeURIComponent(from.toISOString().replace(/\.\d+Z$/, "Z"))}&to=${encodeURIComponent(to.toISOString().replace(/\.\d+Z$/, "Z"))}&group_by=${group}`;
    const all = ctx.superadmin && !narrow.checked;
    const base = all ? "/usage" : path("orgs", ctx.org, "usage");
    try {
      const [byHour, byKey] = await Promise.all([api("GET", base + q("hour")), api("GET", base + q("key,model"))]);
      const rows = byKey.data.data.map((u) => [
        ...(all ? [orgName(u.org)] : []), u.key, u.model, num(u.requests), num(u.refused),
        num(u.prompt_tokens), num(u.cached_tokens), num(u.completion_tokens)]);
      const cols = [...(all ? ["Org"] : []), "Key", "Model", "Requests", "Refused", "Prompt tokens", "Cached tokens", "Completion tokens"];
      replace(body, chart(byHour.data.data, from, hours, body.clientWidth),
        rows.length ? table(`Per key and model, ${all ? "every org" : orgName(ctx.org)}`, cols, rows)
          : h("p", { class: "empty" }, "No usage in this range yet."));
    } catch (err) {
      replace(body, h("p", { class: "error", role: "alert" }, "Cannot read the usage: " + describe(err)));
    }
  };
  narrow.addEventListener("change", load);
  range.addEventListener("change", load);
  ctx.show(h("section", {}, h("h1", { tabindex: "-1" }, "Usage"), controls, body));
  await load();
}

function num(n) {
  return Number(n).toLocaleString("en-US");
}

// chart draws tokens per hour over the range's hours, from its first (from) to the current one: one line
// per kind, hours without usage at zero, every org's summed.
function chart(rows, from, hours, width) {
  const W = Math.max(300, Math.min(1100, Math.round(width || 640) - 20)), H = 180, L = 56, R = 8, T = 10, B = 24;
  const sums = KINDS.map(() => new Array(hours).fill(0));
  for (const u of rows) {
    const i = Math.round((new Date(u.start).getTime() - from.getTime()) / HOUR);
    if (i < 0 || i >= hours) continue;
    KINDS.forEach(([f], k) => { sums[k][i] += u[f]; });
  }
  let peak = 0;
  for (const s of sums) for (const v of s) peak = Math.max(peak, v);
  const max = niceCeil(Math.max(1, peak));
  const x = (i) => L + (hours > 1 ? i / (hours - 1) : 0) * (W - L - R);
  const y = (v) => T + (1 - v / max) * (H - T - B);
  const totals = sums.map((s) => s.reduce((a, b) => a + b, 0));
  const label = `Tokens per hour over the last ${hours} hours: ${KINDS.map(([, l], k) => `${l.toLowerCase()} ${num(totals[k])}`).join(", ")}.`;
  return h("figure", { class: "chart" },
    svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label, id: "usage-chart", "data-peak": String(peak),
      "data-totals": totals.join(",") },
      svg("line", { class: "axis", x1: L, y1: y(0), x2: W - R, y2: y(0) }),
      svg("line", { class: "grid", x1: L, y1: y(max / 2), x2: W - R, y2: y(max / 2) }),
      svg("line", { class: "grid", x1: L, y1: y(max), x2: W - R, y2: y(max) }),
      svg("text", { class: "tick", x: L - 6, y: y(max) + 4, "text-anchor": "end" }, num(max)),
      svg("text", { class: "tick", x: L - 6, y: y(max / 2) + 4, "text-anchor": "end" }, num(max / 2)),
      svg("text", { class: "tick", x: L - 6, y: y(0) + 4, "text-anchor": "end" }, "0"),
      svg("text", { class: "tick", x: L, y: H - 6 }, `−${hours} h`),
      svg("text", { class: "tick", x: W - R, y: H - 6, "text-anchor": "end" }, "now"),
      sums.map((s, k) => svg("polyline", { class: `series s${k}`, "data-kind": KINDS[k][0],
        points: s.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ") }))),
    h("figcaption", {}, h("span", {}, "Tokens per hour: "),
      h("ul", { class: "legend" }, KINDS.map(([, l], k) => h("li", {}, h("span", { class: `swatch s${k}`, "aria-hidden": "true" }), l)))));
}

// niceCeil rounds up to 1, 2 or 5 times a power of ten, for the chart's top line.
function niceCeil(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}
