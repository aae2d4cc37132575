// Providers: the list, and the sheet that creates and edits one (with its KV events and LMCache sources,
// each behind its own switch: off and saved, the source is removed; PUT replaces a provider whole).

import { api, path, describe } from "./api.js";
import { h, replace, table, confirmButton } from "./dom.js";
import { Sheet, text, number, numberValue, stringValue, linesValue, prune, show } from "./form.js";

export async function providersList(ctx) {
  const body = h("div", {}, h("p", { class: "loading" }, "Loading providers…"));
  const el = h("section", {},
    h("div", { class: "page-head" },
      h("h1", { tabindex: "-1" }, "Providers"),
      ctx.readOnly ? null : h("a", { class: "button", href: "#/providers/new", id: "new-provider" }, "New provider")),
    ctx.readOnly ? h("p", { class: "note" }, "rolter.toml's providers: read-only here; change the file and send SIGHUP.") : null,
    body);
  ctx.show(el);
  try {
    const { data } = await api("GET", path("orgs", ctx.org, "providers"));
    const rows = data.data.map((p) => [
      h("td", { "data-label": "Name" }, h("a", { href: "#/providers/edit/" + encodeURIComponent(p.name) }, p.name)),
      p.api_base,
      String(p.max_conns),
      p.kv_events ? p.kv_events.endpoint : "—",
      p.lmcache ? p.lmcache.endpoint : "—",
      p.version ? String(p.version) : "file",
    ]);
    replace(body, rows.length
      ? table(null, ["Name", "API base", "Max conns", "KV events source", "LMCache source", "Version"], rows)
      : h("p", { class: "empty" }, "No providers yet."));
  } catch (err) {
    replace(body, h("p", { class: "error", role: "alert" }, "Cannot list the providers: " + describe(err)));
  }
}

// providerSheet is the sheet of a new provider (name undefined) or of an existing one.
export async function providerSheet(ctx, name) {
  const s = new Sheet("p", name === undefined ? "New provider" : `Provider ${name}`);
  let current = null; // the provider as the API last answered it
  let etag = null;

  const f = {
    name: text({ required: true }),
    api_base: text({ required: true, inputmode: "url" }),
    api_key_env: text({ placeholder: "blank: none" }),
    max_conns: number({ placeholder: "blank: default" }),
    kvOn: h("input", { type: "checkbox", role: "switch", id: "p-kv-switch" }),
    kv: {
      endpoint: text({ placeholder: "tcp://10.0.3.7:5557" }),
      topic: text({ placeholder: "blank: none" }),
      replay_endpoint: text({ placeholder: "blank: none" }),
      mode: h("select", {}, h("option", { value: "" }, "default (connect)"), h("option", { value: "connect" }, "connect"), h("option", { value: "bind" }, "bind")),
      max_blocks: number({ placeholder: "blank: default" }),
      stale_secs: number({ placeholder: "blank: default" }),
      allowed_publishers: h("textarea", { rows: 2, spellcheck: "false" }),
      curve_secret_key_env: text({ placeholder: "blank: no CURVE" }),
      curve_client_keys: h("textarea", { rows: 2, spellcheck: "false" }),
    },
    lcOn: h("input", { type: "checkbox", role: "switch", id: "p-lmcache-switch" }),
    lc: {
      endpoint: text({ inputmode: "url" }),
      refresh_secs: number({ placeholder: "blank: default" }),
      stale_secs: number({ placeholder: "blank: default" }),
    },
  };
  const headers = h("div", { class: "rows", id: "p-headers" });
  const addHeader = (k = "", v = "") => {
    const key = text({ value: k, "aria-label": "Header name" });
    const val = text({ value: v, "aria-label": "Header value" });
    const row = h("div", { class: "row" }, key, val,
      h("button", { type: "button", onclick: () => { row.remove(); addBtn.focus(); } }, "Remove"));
    headers.append(row);
    return key;
  };
  const addBtn = h("button", { type: "button", id: "p-add-header", onclick: () => addHeader().focus() }, "Add header");

  // The publishers' allow-list and CURVE apply to bind mode only: shown when it is chosen (or they hold
  // something, so nothing typed is ever hidden).
  const bindFields = h("div", { id: "p-kv-bind" },
    s.field("kv_events.allowed_publishers", "Allowed publishers", f.kv.allowed_publishers, "Bind mode: one address or CIDR prefix a line; blank: anyone who can reach the port."),
    s.field("kv_events.curve_secret_key_env", "CURVE secret key variable", f.kv.curve_secret_key_env, "Bind mode: the environment variable holding the gateway's CURVE secret key (Z85)."),
    s.field("kv_events.curve_client_keys", "CURVE client keys", f.kv.curve_client_keys, "Bind mode: one publisher public key (Z85) a line."));
  const kvFields = h("div", { class: "source-fields", id: "p-kv-fields" },
    s.field("kv_events.endpoint", "Endpoint", f.kv.endpoint, "The engine's ZMQ publisher (connect) or the gateway's own address (bind). Checked against the egress policy."),
    s.field("kv_events.topic", "Topic", f.kv.topic),
    s.field("kv_events.replay_endpoint", "Replay endpoint", f.kv.replay_endpoint, "The engine's replay ROUTER; blank: a gap clears the target."),
    s.field("kv_events.mode", "Mode", f.kv.mode),
    s.field("kv_events.max_blocks", "Max blocks", f.kv.max_blocks, "Blocks kept per target; blank: the default."),
    s.field("kv_events.stale_secs", "Stale after (seconds)", f.kv.stale_secs, "Silence after which the stream is untrusted; blank: the default."),
    bindFields);
  const lcFields = h("div", { class: "source-fields", id: "p-lmcache-fields" },
    s.field("lmcache.endpoint", "Endpoint", f.lc.endpoint, "The LMCache status address (http or https). Checked against the egress policy."),
    s.field("lmcache.refresh_secs", "Refresh every (seconds)", f.lc.refresh_secs, "Blank: the default."),
    s.field("lmcache.stale_secs", "Stale after (seconds)", f.lc.stale_secs, "Blank: the default."));
  const sync = () => {
    kvFields.hidden = !f.kvOn.checked;
    lcFields.hidden = !f.lcOn.checked;
    const bindSet = [f.kv.allowed_publishers, f.kv.curve_secret_key_env, f.kv.curve_client_keys].some((el) => el.value.trim() !== "");
    bindFields.hidden = f.kv.mode.value !== "bind" && !bindSet;
  };
  f.kvOn.addEventListener("change", sync);
  f.lcOn.addEventListener("change", sync);
  f.kv.mode.addEventListener("change", sync);

  const source = (sw, label, path, hint, fields) => {
    const err = s.group(path, sw);
    return h("fieldset", { class: "source" },
      h("legend", {}, h("label", { class: "switch" }, sw, h("span", {}, label))),
      h("p", { class: "hint" }, hint), err, fields);
  };

  const save = h("button", { type: "submit", class: "primary", id: "p-save" }, "Save");
  const actions = h("div", { class: "actions" }, ctx.readOnly ? null : save, h("a", { href: "#/providers", class: "button" }, ctx.readOnly ? "Back" : "Cancel"));
  const headersErr = s.group("headers", headers);
  replace(s.form,
    s.heading, s.top,
    ctx.readOnly ? h("p", { class: "note" }, "Defined in rolter.toml: read-only here; change the file and send SIGHUP.") : null,
    h("fieldset", {}, h("legend", {}, "Provider"),
      s.field("name", "Name", f.name, "Unique in the org; routes name it."),
      s.field("api_base", "API base", f.api_base, "The engine's OpenAI-compatible API: an http or https address, such as the engine's host and port 8000. Checked against the egress policy."),
      s.field("api_key_env", "API key variable", f.api_key_env, "The gateway's environment variable holding the upstream API key."),
      s.field("max_conns", "Max connections", f.max_conns, "Upstream connection cap; blank: the default.")),
    h("fieldset", {}, h("legend", {}, "Headers sent upstream"), headersErr, headers, ctx.readOnly ? null : addBtn),
    source(f.kvOn, "KV events source", "kv_events", "vLLM KV events, for precise_cache_aware. Off and saved: the source is removed.", kvFields),
    source(f.lcOn, "LMCache source", "lmcache", "An LMCache status endpoint, for lmcache_aware. Off and saved: the source is removed.", lcFields),
    actions, s.status);

  const fill = (p) => {
    current = p;
    f.name.value = p.name || "";
    f.api_base.value = show(p.api_base);
    f.api_key_env.value = show(p.api_key_env);
    f.max_conns.value = show(p.max_conns);
    headers.replaceChildren();
    for (const [k, v] of Object.entries(p.headers || {})) addHeader(k, v);
    f.kvOn.checked = !!p.kv_events;
    const kv = p.kv_events || {};
    for (const k of ["endpoint", "topic", "replay_endpoint", "mode", "max_blocks", "stale_secs", "curve_secret_key_env"]) {
      if (p.kv_events) f.kv[k].value = show(kv[k]);
    }
    if (p.kv_events) {
      f.kv.allowed_publishers.value = (kv.allowed_publishers || []).join("\n");
      f.kv.curve_client_keys.value = (kv.curve_client_keys || []).join("\n");
    }
    f.lcOn.checked = !!p.lmcache;
    if (p.lmcache) for (const k of ["endpoint", "refresh_secs", "stale_secs"]) f.lc[k].value = show(p.lmcache[k]);
    sync();
  };

  // collect is the body to send: what was typed, blanks left out (the API then applies its defaults), a
  // source whose switch is off left out (PUT replaces the provider whole, so it is removed).
  const collect = () => {
    const p = prune({
      name: name === undefined ? stringValue(f.name) : undefined,
      kind: current && current.kind ? current.kind : undefined,
      api_base: f.api_base.value.trim(),
      api_key_env: stringValue(f.api_key_env),
      max_conns: numberValue(f.max_conns),
    });
    const hs = {};
    for (const row of headers.children) {
      const [k, v] = row.querySelectorAll("input");
      if (k.value.trim() !== "" || v.value !== "") hs[k.value.trim()] = v.value;
    }
    if (Object.keys(hs).length) p.headers = hs;
    if (f.kvOn.checked) {
      p.kv_events = prune({
        endpoint: f.kv.endpoint.value.trim(),
        topic: stringValue(f.kv.topic),
        replay_endpoint: stringValue(f.kv.replay_endpoint),
        mode: f.kv.mode.value || undefined,
        max_blocks: numberValue(f.kv.max_blocks),
        stale_secs: numberValue(f.kv.stale_secs),
        allowed_publishers: linesValue(f.kv.allowed_publishers),
        curve_secret_key_env: stringValue(f.kv.curve_secret_key_env),
        curve_client_keys: linesValue(f.kv.curve_client_keys),
      });
    }
    if (f.lcOn.checked) {
      p.lmcache = prune({
        endpoint: f.lc.endpoint.value.trim(),
        refresh_secs: numberValue(f.lc.refresh_secs),
        stale_secs: numberValue(f.lc.stale_secs),
      });
    }
    return p;
  };

  s.form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (ctx.readOnly) return;
    save.disabled = true;
    s.clear();
    try {
      let r;
      if (name === undefined) {
        r = await api("POST", path("orgs", ctx.org, "providers"), collect());
        name = r.data.name;
        history.replaceState(null, "", "#/providers/edit/" + encodeURIComponent(name));
        s.heading.textContent = `Provider ${name}`;
        f.name.disabled = true;
        actions.append(deleteButton());
      } else {
        r = await api("PUT", path("orgs", ctx.org, "providers", name), collect(), etag ? { "If-Match": etag } : {});
      }
      etag = r.etag;
      fill(r.data); // the effective values: the API's defaults filled in
      s.saved(`Saved: version ${r.data.version}; it serves now. Blank numbers show the defaults the API applied.`);
    } catch (err) {
      s.showError(err);
    } finally {
      save.disabled = false;
    }
  });

  const deleteButton = () => confirmButton("Delete provider", "Yes, delete it", async () => {
    try {
      await api("DELETE", path("orgs", ctx.org, "providers", name), undefined, etag ? { "If-Match": etag } : {});
      location.hash = "#/providers";
    } catch (err) {
      s.showError(err);
    }
  });

  ctx.show(h("section", {}, h("p", { class: "crumbs" }, h("a", { href: "#/providers" }, "Providers")), s.form));
  if (name === undefined) {
    f.name.focus();
    sync();
    return;
  }
  f.name.disabled = true;
  try {
    const r = await api("GET", path("orgs", ctx.org, "providers", name));
    etag = r.etag;
    fill(r.data);
    if (ctx.readOnly) {
      for (const el of s.form.querySelectorAll("input, select, textarea")) el.disabled = true;
      for (const el of s.form.querySelectorAll(".rows button")) el.remove();
    } else {
      actions.append(deleteButton());
    }
    s.heading.focus();
  } catch (err) {
    s.showError(err);
  }
}
