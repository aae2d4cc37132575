// Keys: the org's data-plane keys and the limits of the org and of each key. A new key's secret is shown
// once, with a copy button; the API keeps only a keyed hash of it.

import { api, path, describe } from "./api.js";
import { h, replace, table, when, confirmButton } from "./dom.js";
import { Sheet, text, number, numberValue, stringValue, prune } from "./form.js";

export async function keysPage(ctx) {
  const listEl = h("div", {}, h("p", { class: "loading" }, "Loading keys…"));
  const secretEl = h("div", { id: "key-secret" });
  if (ctx.readOnly) {
    ctx.show(h("section", {}, h("h1", { tabindex: "-1" }, "Keys"),
      h("p", { class: "note" }, "rolter.toml has no data-plane keys: its routes are public. Pick an org to see its keys.")));
    return;
  }
  const orgEl = h("div", { id: "org-limits" }, h("p", { class: "loading" }, "Loading the org's limits…"));
  const statusEl = h("p", { class: "sheet-status", role: "status", id: "keys-status" });
  const s = new Sheet("k", "New key");
  const name = text({ required: true, placeholder: "ci" });
  const limits = limitsFields(s, "limits", null);
  const create = h("button", { type: "submit", class: "primary", id: "k-create" }, "Create key");
  s.heading.classList.add("h3");
  s.form.classList.add("inline-form");
  replace(s.form, s.heading, s.top, s.field("name", "Name", name, "Says what the key is for; the secret is made by the control plane."),
    h("fieldset", {}, h("legend", {}, "Limits of its own"),
      h("p", { class: "hint" }, "Optional: left blank, the key has its org's key default."), limits.el),
    h("div", { class: "actions" }, create), s.status);

  // edit opens the form of key k's own limits in its row's Limits cell, in place of what it shows.
  const edit = (k, td, button) => {
    const ks = new Sheet("kl-" + k.id, `Limits of ${k.name}`);
    const f = limitsFields(ks, "limits", k.limits);
    const save = h("button", { type: "submit", class: "primary" }, "Save limits");
    const close = () => {
      replace(td, limitsText(k.limits, "org default"));
      button.hidden = false;
      button.focus();
    };
    ks.heading.classList.add("h3");
    ks.form.classList.add("limits-form");
    replace(ks.form, ks.heading, ks.top, h("p", { class: "hint" }, "All blank: the org's key default."), f.el,
      h("div", { class: "actions" }, save, h("button", { type: "button", onclick: close }, "Cancel")), ks.status);
    ks.form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      save.disabled = true;
      ks.clear();
      try {
        await api("PUT", path("orgs", ctx.org, "keys", k.id, "limits"), { limits: f.value() });
        statusEl.textContent = `Limits of key ${k.name} saved.`;
        await load();
        document.getElementById("kl-edit-" + k.id)?.focus();
      } catch (err) {
        ks.showError(err);
      } finally {
        save.disabled = false;
      }
    });
    button.hidden = true;
    replace(td, ks.form);
    ks.form.querySelector("input").focus();
  };

  const load = async () => {
    try {
      const { data } = await api("GET", path("orgs", ctx.org, "keys"));
      const rows = data.data.map((k) => {
        const td = h("td", { "data-label": "Limits", "data-col": "limits" }, limitsText(k.limits, "org default"));
        const button = h("button", { type: "button", id: "kl-edit-" + k.id, onclick: () => edit(k, td, button) }, "Edit limits");
        return [
          k.name, h("td", { "data-label": "Id" }, h("code", {}, k.id)), h("td", { "data-label": "Starts with" }, h("code", {}, k.prefix + "…")),
          when(k.created), k.revoked ? `revoked ${when(k.revoked)}` : "active", td,
          k.revoked ? "" : h("td", { "data-label": "" }, confirmButton("Revoke", `Yes, revoke ${k.name}`, async () => {
            try {
              await api("DELETE", path("orgs", ctx.org, "keys", k.id));
              replace(secretEl);
              await load();
              document.querySelector("#keys-list h2")?.focus();
            } catch (err) {
              replace(listEl, h("p", { class: "error", role: "alert" }, "Cannot revoke the key: " + describe(err)));
            }
          }), " ", button),
        ];
      });
      replace(listEl, h("h2", { tabindex: "-1" }, "Keys of this org"), rows.length
        ? table(null, ["Name", "Id", "Starts with", "Created", "State", "Limits", "Actions"], rows)
        : h("p", { class: "empty" }, "No keys yet: the org's routes serve nobody until it has one."));
    } catch (err) {
      replace(listEl, h("p", { class: "error", role: "alert" }, "Cannot list the keys: " + describe(err)));
    }
  };

  s.form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    create.disabled = true;
    s.clear();
    try {
      const { data } = await api("POST", path("orgs", ctx.org, "keys"), prune({ name: stringValue(name) || "", limits: limits.value() ?? undefined }));
      name.value = "";
      limits.reset();
      showSecret(secretEl, data);
      await load();
    } catch (err) {
      s.showError(err);
    } finally {
      create.disabled = false;
    }
  });

  ctx.show(h("section", {}, h("h1", { tabindex: "-1" }, "Keys"),
    h("p", { class: "hint" }, "Data-plane keys: clients send one as Authorization: Bearer to use this org's routes."),
    orgEl, s.form, secretEl, statusEl, h("div", { id: "keys-list" }, listEl)));
  await Promise.all([orgLimits(ctx, orgEl), load()]);
}

// orgLimits shows the org's own limits and its keys' default in el, with their form for the superadmin
// (an org admin may not raise what caps its own org).
async function orgLimits(ctx, el) {
  const heading = h("h2", { id: "org-limits-heading" }, "Limits of this org");
  let data;
  try {
    ({ data } = await api("GET", path("orgs", ctx.org, "limits")));
  } catch (err) {
    replace(el, heading, h("p", { class: "error", role: "alert" }, "Cannot read the org's limits: " + describe(err)));
    return;
  }
  const own = h("dd", { id: "org-limits-own" }), keys = h("dd", { id: "org-limits-keys" });
  const fill = (d) => {
    own.textContent = limitsText(d.limits, "rolter.toml's default");
    keys.textContent = limitsText(d.key_limits, "rolter.toml's default");
  };
  fill(data);
  const summary = h("dl", { class: "limits-summary" },
    h("dt", {}, "The org's own (all its keys together)"), own, h("dt", {}, "Each key's default"), keys);
  if (!ctx.superadmin) {
    replace(el, heading, summary, h("p", { class: "hint", id: "org-limits-who" }, "Only the superadmin can change them. A key's own limits, below, are capped by the org's."));
    return;
  }
  const s = new Sheet("ol", "The org's limits");
  const org = limitsFields(s, "limits", data.limits), key = limitsFields(s, "key_limits", data.key_limits);
  const save = h("button", { type: "submit", class: "primary", id: "ol-save" }, "Save org limits");
  s.heading.classList.add("h3");
  replace(s.form, s.heading, s.top, h("p", { class: "hint" }, "A blank field limits nothing; all blank: none of its own, rolter.toml's [limits] applies."),
    h("fieldset", {}, h("legend", {}, "The org's own, all its keys together"), org.el),
    h("fieldset", {}, h("legend", {}, "Each key's default, where the key has none of its own"), key.el),
    h("div", { class: "actions" }, save), s.status);
  s.form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    save.disabled = true;
    s.clear();
    try {
      const { data } = await api("PUT", path("orgs", ctx.org, "limits"), { limits: org.value(), key_limits: key.value() });
      fill(data);
      s.saved("The org's limits are saved.");
    } catch (err) {
      s.showError(err);
    } finally {
      save.disabled = false;
    }
  });
  replace(el, heading, summary, h("details", { id: "org-limits-edit" }, h("summary", {}, "Change the org's limits"), s.form));
}

const LIMITS = [["rpm", "Requests a minute"], ["tpm", "Tokens a minute"], ["concurrent", "Requests in flight"]];

// limitsFields returns the fields of one limits object in sheet s under the path at ("limits", "key_limits"),
// filled from l: value() is what is typed, null when all is blank (none of its own). l's per-model limits
// are shown, and kept unless unticked.
function limitsFields(s, at, l) {
  const inputs = LIMITS.map(([k]) => number({ placeholder: "none", value: l && l[k] ? String(l[k]) : "" }));
  const models = l && l.models && Object.keys(l.models).length ? l.models : null;
  const keep = models && h("input", { type: "checkbox", checked: true });
  const el = h("div", { class: "limit-fields" }, LIMITS.map(([k, label], i) => s.field(`${at}.${k}`, label, inputs[i])),
    keep && h("div", { class: "field" }, h("label", { class: "check" }, keep, " Keep the per-model limits: ", modelsText(models)), s.group(`${at}.models`, keep)));
  return {
    el,
    value: () => {
      const o = prune(Object.fromEntries(LIMITS.map(([k], i) => [k, numberValue(inputs[i])])));
      if (keep && keep.checked) o.models = models;
      return Object.keys(o).length ? o : null;
    },
    reset: () => inputs.forEach((i) => { i.value = ""; }),
  };
}

// limitsText is limits in a line: "600 rpm · 200k tpm · 32 in flight; llama: 50k tpm"; none for null.
function limitsText(l, none) {
  if (!l) return none;
  return [oneLimit(l), modelsText(l.models)].filter(Boolean).join("; ") || "no limit";
}

function modelsText(models) {
  return Object.entries(models || {}).map(([m, l]) => `${m}: ${oneLimit(l) || "no limit"}`).join("; ");
}

function oneLimit(l) {
  return [l.rpm && `${qty(l.rpm)} rpm`, l.tpm && `${qty(l.tpm)} tpm`, l.concurrent && `${qty(l.concurrent)} in flight`].filter(Boolean).join(" · ");
}

// qty writes round thousands and millions short: 200000 is "200k", 2500000 "2.5M".
function qty(n) {
  if (n >= 1e6 && n % 1e5 === 0) return n / 1e6 + "M";
  if (n >= 1e3 && n % 100 === 0) return n / 1e3 + "k";
  return String(n);
}

// showSecret shows a new key's secret, the only time it can be seen, with a copy button.
function showSecret(el, key) {
  const field = h("input", { type: "text", readonly: true, value: key.secret, id: "key-secret-value", class: "secret", "aria-label": `Secret of key ${key.name}`, spellcheck: "false" });
  const said = h("span", { role: "status", class: "copied" });
  const copy = h("button", {
    type: "button", id: "key-copy",
    onclick: async () => {
      try {
        await navigator.clipboard.writeText(field.value);
        said.textContent = "Copied.";
      } catch {
        field.focus();
        field.select();
        said.textContent = "Selected: press Ctrl+C (⌘C) to copy.";
      }
    },
  }, "Copy");
  replace(el, h("div", { class: "secret-box", role: "alert" },
    h("p", {}, h("strong", {}, `Key ${key.name} (${key.id}) is made. `), "Copy its secret now: it is shown only this once."),
    h("div", { class: "row" }, field, copy, said)));
  copy.focus();
}
