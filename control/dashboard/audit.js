// Audit: every change, newest first. The superadmin sees the whole log (or one org's); an org admin token
// its org's.

import { api, path, describe } from "./api.js";
import { h, replace, table, when } from "./dom.js";

const LIMIT = 200;

export async function auditPage(ctx) {
  const listEl = h("div", {}, h("p", { class: "loading" }, "Loading the audit log…"));
  const narrow = h("input", { type: "checkbox", id: "audit-org-only" });
  const org = ctx.orgs.find((o) => o.id === ctx.org);
  const filter = ctx.superadmin && ctx.org !== "file"
    ? h("p", {}, h("label", { class: "check" }, narrow, ` Only ${org ? org.name : ctx.org}`))
    : null;
  const orgName = (id) => (id ? (ctx.orgs.find((o) => o.id === id) || { name: id }).name : "");

  const load = async () => {
    let p;
    if (!ctx.superadmin) p = path("orgs", ctx.org, "audit") + `?limit=${LIMIT}`;
    else if (narrow.checked) p = `/audit?limit=${LIMIT}&org=${encodeURIComponent(ctx.org)}`;
    else p = `/audit?limit=${LIMIT}`;
    try {
      const { data } = await api("GET", p);
      const rows = data.data.map((e) => [when(e.at), String(e.generation), e.actor, orgName(e.org), e.action, e.object, e.name, e.detail]);
      replace(listEl, rows.length
        ? table(`The ${rows.length === LIMIT ? `newest ${LIMIT}` : rows.length} changes, newest first`,
          ["When", "Generation", "Who", "Org", "Action", "Object", "Name", "Detail"], rows)
        : h("p", { class: "empty" }, "No changes yet."));
    } catch (err) {
      replace(listEl, h("p", { class: "error", role: "alert" }, "Cannot read the audit log: " + describe(err)));
    }
  };
  narrow.addEventListener("change", load);
  ctx.show(h("section", {}, h("h1", { tabindex: "-1" }, "Audit log"), filter, listEl));
  await load();
}
