// Keys: the org's data-plane keys. A new key's secret is shown once, with a copy button; the API keeps
// only a keyed hash of it.

import { api, path, describe } from "./api.js";
import { h, replace, table, when, confirmButton } from "./dom.js";
import { Sheet, text, stringValue } from "./form.js";

export async function keysPage(ctx) {
  const listEl = h("div", {}, h("p", { class: "loading" }, "Loading keys…"));
  const secretEl = h("div", { id: "key-secret" });
  if (ctx.readOnly) {
    ctx.show(h("section", {}, h("h1", { tabindex: "-1" }, "Keys"),
      h("p", { class: "note" }, "rolter.toml has no data-plane keys: its routes are public. Pick an org to see its keys.")));
    return;
  }
  const s = new Sheet("k", "New key");
  const name = text({ required: true, placeholder: "ci" });
  const create = h("button", { type: "submit", class: "primary", id: "k-create" }, "Create key");
  s.heading.classList.add("h3");
  s.form.classList.add("inline-form");
  replace(s.form, s.heading, s.top, s.field("name", "Name", name, "Says what the key is for; the secret is made by the control plane."), h("div", { class: "actions" }, create), s.status);

  const load = async () => {
    try {
      const { data } = await api("GET", path("orgs", ctx.org, "keys"));
      const rows = data.data.map((k) => [
        k.name, h("td", { "data-label": "Id" }, h("code", {}, k.id)), h("td", { "data-label": "Starts with" }, h("code", {}, k.prefix + "…")),
        when(k.created), k.revoked ? `revoked ${when(k.revoked)}` : "active",
        k.revoked ? "" : h("td", { "data-label": "" }, confirmButton("Revoke", `Yes, revoke ${k.name}`, async () => {
          try {
            await api("DELETE", path("orgs", ctx.org, "keys", k.id));
            replace(secretEl);
            await load();
            document.querySelector("#keys-list h2")?.focus();
          } catch (err) {
            replace(listEl, h("p", { class: "error", role: "alert" }, "Cannot revoke the key: " + describe(err)));
          }
        })),
      ]);
      replace(listEl, h("h2", { tabindex: "-1" }, "Keys of this org"), rows.length
        ? table(null, ["Name", "Id", "Starts with", "Created", "State", "Actions"], rows)
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
      const { data } = await api("POST", path("orgs", ctx.org, "keys"), { name: stringValue(name) || "" });
      name.value = "";
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
    s.form, secretEl, h("div", { id: "keys-list" }, listEl)));
  await load();
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
