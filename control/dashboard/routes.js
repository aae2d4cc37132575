// Routes: the list, and the sheet with the targets, their weights, the strategy picker (with the caveat of
// the cache strategies that need a source, and a link to the strategy's documentation page when [docs]
// base_url is set) and the chosen strategy's parameters.

import { api, path, describe } from "./api.js";
import { h, replace, table, confirmButton } from "./dom.js";
import { Sheet, text, number, numberValue, stringValue, prune, show } from "./form.js";

// CAVEAT is said under the strategies marked "caveat" in strategies.json: they read a per-provider source
// (KV events, LMCache), and a target without one is ranked as least_load ranks it.
export const CAVEAT = "A provider with no source routes by least load.";

// docsBase returns [docs] base_url without its trailing slashes when it is an http(s) URL or a path on
// this origin ("/docs", the control plane's own documentation, when rolter.toml sets none); "" for
// anything else ("//host" included), so a link never takes another scheme such as javascript:.
export function docsBase(info) {
  const base = (info && info.docs_base_url) || "";
  if (!/^https?:\/\//i.test(base) && !/^\/(?!\/)/.test(base)) return "";
  return base.replace(/\/+$/, "");
}

// docsLink returns the documentation address of a strategy: <[docs] base_url>/routing/<page>, the page
// being strategies.json's "docs" (e.g. /routing/precise-cache-aware; control/dashboard.go says why these
// paths stay stable), or "" when no documentation host is configured. Only http(s) addresses are linked.
export function docsLink(info, spec) {
  const base = docsBase(info);
  if (!base || !spec || !spec.docs) return "";
  return base + spec.docs;
}

export async function routesList(ctx) {
  const body = h("div", {}, h("p", { class: "loading" }, "Loading routes…"));
  ctx.show(h("section", {},
    h("div", { class: "page-head" },
      h("h1", { tabindex: "-1" }, "Routes"),
      ctx.readOnly ? null : h("a", { class: "button", href: "#/routes/new", id: "new-route" }, "New route")),
    ctx.readOnly ? h("p", { class: "note" }, "rolter.toml's routes: read-only here; change the file and send SIGHUP.") : null,
    body));
  try {
    const { data } = await api("GET", path("orgs", ctx.org, "routes"));
    const rows = data.data.map((r) => [
      h("td", { "data-label": "Model" }, h("a", { href: "#/routes/edit/" + encodeURIComponent(r.model) }, r.model)),
      r.strategy,
      r.targets.map((t) => `${t.provider} → ${t.model} (weight ${t.weight})`).join("; "),
      r.version ? String(r.version) : "file",
    ]);
    replace(body, rows.length
      ? table(null, ["Model", "Strategy", "Targets", "Version"], rows)
      : h("p", { class: "empty" }, "No routes yet."));
  } catch (err) {
    replace(body, h("p", { class: "error", role: "alert" }, "Cannot list the routes: " + describe(err)));
  }
}

// routeSheet is the sheet of a new route (model undefined) or of an existing one.
export async function routeSheet(ctx, model) {
  const strategies = ctx.strategies;
  const s = new Sheet("r", model === undefined ? "New route" : `Route ${model}`);
  let etag = null;
  const paramValues = {}; // kept across strategy changes, so switching back restores what was typed

  const f = {
    model: text({ required: true }),
    strategy: h("select", {}, Object.keys(strategies).map((n) => h("option", { value: n }, n))),
  };
  const summary = h("p", { class: "hint", id: "r-strategy-summary" });
  const caveat = h("p", { class: "caveat", id: "strategy-caveat", hidden: true }, CAVEAT);
  const docs = h("p", { class: "docs", id: "strategy-docs", hidden: true });
  const params = h("div", { class: "params", id: "r-params" });
  f.strategy.setAttribute("aria-describedby", "r-strategy-summary strategy-caveat strategy-docs");

  // The providers a target may name: the org's, and (for the superadmin, who can list them) the file's,
  // loaded before the rows are drawn; a target picks one of them.
  const providers = await listProviders(ctx);
  const targets = h("div", { class: "rows targets", id: "r-targets" });
  const renumber = () => {
    [...targets.children].forEach((row, i) => {
      for (const input of row.querySelectorAll("[data-col]")) {
        const p = `targets[${i}].${input.dataset.col}`;
        input.dataset.field = p;
        input.setAttribute("aria-label", `Target ${i + 1} ${input.dataset.label}`);
      }
    });
  };
  let targetSeq = 0; // makes the ids of a row's error elements unique
  const addTarget = (t = {}) => {
    const cell = (col, label, input) => {
      const err = h("p", { class: "field-error", hidden: true, id: `r-t${targetSeq}-${col}-error` });
      input.dataset.col = col;
      input.dataset.label = label;
      input.dataset.error = err.id;
      input.setAttribute("aria-describedby", err.id);
      return h("div", { class: "cell" }, h("span", { class: "cell-label", "aria-hidden": "true" }, label), input, err);
    };
    targetSeq++;
    const prov = providerPicker(providers, t.provider || "");
    const up = text({ value: t.model && t.model !== (model || f.model.value) ? t.model : "", placeholder: "blank: the route's model" });
    const weight = number({ value: show(t.weight), placeholder: "blank: 1" });
    const row = h("div", { class: "row target" },
      cell("provider", "provider", prov), cell("model", "upstream model", up), cell("weight", "weight", weight),
      ctx.readOnly ? null : h("button", { type: "button", onclick: () => { row.remove(); renumber(); addBtn.focus(); } }, "Remove"));
    prov.after(prov.other);
    targets.append(row);
    renumber();
    return prov;
  };
  const addBtn = h("button", { type: "button", id: "r-add-target", onclick: () => addTarget().focus() }, "Add target");

  const showStrategy = () => {
    const name = f.strategy.value;
    const spec = strategies[name] || { params: [] };
    summary.textContent = spec.summary || "";
    caveat.hidden = !spec.caveat;
    const link = docsLink(ctx.info, spec);
    docs.hidden = link === "";
    replace(docs, link ? ["Documentation: ", h("a", { href: link, id: "strategy-docs-link" }, `${name} (${link})`)] : []);
    for (const input of params.querySelectorAll("input")) paramValues[input.dataset.param] = input.value;
    replace(params, spec.params.length ? spec.params.map((p) => {
      const input = number({ value: paramValues[p.name] || "", placeholder: "blank: default" });
      input.dataset.param = p.name;
      input.dataset.type = p.type;
      return s.field("params." + p.name, p.name, input, p.hint);
    }) : h("p", { class: "hint" }, `${name} takes no parameters.`));
    if (ctx.readOnly) for (const el of params.querySelectorAll("input")) el.disabled = true;
  };
  f.strategy.addEventListener("change", showStrategy);

  const save = h("button", { type: "submit", class: "primary", id: "r-save" }, "Save");
  const actions = h("div", { class: "actions" }, ctx.readOnly ? null : save, h("a", { href: "#/routes", class: "button" }, ctx.readOnly ? "Back" : "Cancel"));
  const targetsErr = s.group("targets", targets);
  const paramsErr = s.group("params", params);
  replace(s.form,
    s.heading, s.top,
    ctx.readOnly ? h("p", { class: "note" }, "Defined in rolter.toml: read-only here; change the file and send SIGHUP.") : null,
    h("fieldset", {}, h("legend", {}, "Route"),
      s.field("model", "Public model name", f.model, "The model clients ask for; one namespace across orgs."),
      s.field("strategy", "Strategy", f.strategy),
      summary, caveat, docs),
    h("fieldset", {}, h("legend", {}, "Targets"),
      h("p", { class: "hint" }, "Each target is a provider (the org's, or a shared one of rolter.toml) and the model it serves."),
      targetsErr, targets, ctx.readOnly ? null : addBtn),
    h("fieldset", {}, h("legend", {}, "Parameters"), paramsErr, params),
    actions, s.status);

  const fill = (r) => {
    f.model.value = r.model || "";
    f.strategy.value = r.strategy || "round_robin";
    // The API's answer replaces what was typed: showStrategy must not copy the old inputs back over it.
    params.replaceChildren();
    for (const k of Object.keys(paramValues)) delete paramValues[k];
    for (const [k, v] of Object.entries(r.params || {})) paramValues[k] = show(v);
    targets.replaceChildren();
    for (const t of r.targets || []) addTarget(t);
    showStrategy();
  };

  // collect is the body to send: blanks left out (the API's defaults), the chosen strategy's parameters
  // only.
  const collect = () => {
    const r = prune({ model: model === undefined ? stringValue(f.model) : undefined, strategy: f.strategy.value });
    r.targets = [...targets.children].map((row) => {
      const get = (col) => row.querySelector(`[data-col="${col}"]`);
      return prune({ provider: pickedProvider(get("provider")), model: stringValue(get("model")), weight: numberValue(get("weight")) });
    });
    const ps = {};
    for (const input of params.querySelectorAll("input")) {
      const v = numberValue(input);
      if (v !== undefined) ps[input.dataset.param] = v;
    }
    if (Object.keys(ps).length) r.params = ps;
    return r;
  };

  s.form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (ctx.readOnly) return;
    save.disabled = true;
    s.clear();
    try {
      let r;
      if (model === undefined) {
        r = await api("POST", path("orgs", ctx.org, "routes"), collect());
        model = r.data.model;
        history.replaceState(null, "", "#/routes/edit/" + encodeURIComponent(model));
        s.heading.textContent = `Route ${model}`;
        f.model.disabled = true;
        actions.append(deleteButton());
      } else {
        r = await api("PUT", path("orgs", ctx.org, "routes", model), collect(), etag ? { "If-Match": etag } : {});
      }
      etag = r.etag;
      fill(r.data);
      s.saved(`Saved: version ${r.data.version}; it serves now.`);
    } catch (err) {
      s.showError(err);
    } finally {
      save.disabled = false;
    }
  });

  const deleteButton = () => confirmButton("Delete route", "Yes, delete it", async () => {
    try {
      await api("DELETE", path("orgs", ctx.org, "routes", model), undefined, etag ? { "If-Match": etag } : {});
      location.hash = "#/routes";
    } catch (err) {
      s.showError(err);
    }
  });

  ctx.show(h("section", {}, h("p", { class: "crumbs" }, h("a", { href: "#/routes" }, "Routes")), s.form));
  if (model === undefined) {
    fill({ strategy: "round_robin", targets: [{}] });
    f.model.focus();
    return;
  }
  f.model.disabled = true;
  try {
    const r = await api("GET", path("orgs", ctx.org, "routes", model));
    etag = r.etag;
    fill(r.data);
    if (ctx.readOnly) {
      for (const el of s.form.querySelectorAll("input, select, textarea")) el.disabled = true;
    } else {
      actions.append(deleteButton());
    }
    s.heading.focus();
  } catch (err) {
    s.showError(err);
  }
}

// OTHER is the picker's choice of a provider it does not list: a shared provider of rolter.toml, which an
// org admin cannot list, typed in the field it reveals.
const OTHER = "\u0000other";

// listProviders returns the providers a target may pick, [{name, from}]: the org's, then rolter.toml's
// shared ones (listed only to the superadmin). A list that cannot be read is left out: the picker still
// offers "other", and the API checks every name.
async function listProviders(ctx) {
  const orgs = ctx.org === "file" ? ["file"] : ctx.superadmin ? [ctx.org, "file"] : [ctx.org];
  const out = [];
  for (const org of orgs) {
    try {
      const { data } = await api("GET", path("orgs", org, "providers"));
      for (const p of data.data) out.push({ name: p.name, from: org === "file" && ctx.org !== "file" ? "rolter.toml, shared" : "this org" });
    } catch {
      // Listed or not, the route is checked by the API when it is saved.
    }
  }
  return out;
}

// providerPicker is a target's provider field: a select of the providers, the current name kept even when
// the list lacks it, and "other" revealing a text field for a name the list cannot show.
function providerPicker(providers, current) {
  const select = h("select", {},
    h("option", { value: "", disabled: true }, "choose a provider"),
    providers.map((p) => h("option", { value: p.name }, `${p.name} (${p.from})`)),
    current && !providers.some((p) => p.name === current) ? h("option", { value: current }, current) : null,
    h("option", { value: OTHER }, "other: a shared provider of rolter.toml…"));
  select.value = current;
  const other = text({ placeholder: "provider name", hidden: true, "aria-label": "Provider name" });
  select.addEventListener("change", () => {
    other.hidden = select.value !== OTHER;
    if (!other.hidden) other.focus();
  });
  select.other = other; // placed after the select by addTarget
  return select;
}

// pickedProvider is the provider a target's picker names.
function pickedProvider(select) {
  return select.value === OTHER ? select.other.value.trim() : select.value;
}
