// Forms whose fields show the API's field errors beside them. The API is the one validator: the dashboard
// sends what was typed and shows what the API answers ({"error":{"fields":[{"field","message"}]}}).

import { h, idFor, replace } from "./dom.js";
import { APIError, Unreachable, describe } from "./api.js";

// Sheet is a form of API fields. Every input is registered under its JSON path ("kv_events.endpoint",
// "targets[0].weight"); an error for that path is shown in the element its aria-describedby names.
export class Sheet {
  constructor(prefix, heading) {
    this.prefix = prefix;
    this.top = h("div", { class: "form-errors", role: "alert", tabindex: "-1", hidden: true, id: prefix + "-errors" });
    this.status = h("p", { class: "sheet-status", role: "status", id: prefix + "-status" });
    this.heading = h("h2", { tabindex: "-1", id: prefix + "-heading" }, heading);
    this.form = h("form", { class: "sheet", novalidate: true, "aria-labelledby": this.heading.id });
  }

  // field returns a labelled row for input, registered under path. hint is shown under the input.
  field(path, label, input, hint) {
    const id = idFor(this.prefix, path);
    input.id = id;
    const err = h("p", { class: "field-error", id: id + "-error", hidden: true });
    const hintEl = hint ? h("p", { class: "hint", id: id + "-hint" }, hint) : null;
    register(input, path, err, hintEl);
    return h("div", { class: "field" }, h("label", { for: id }, label), input, hintEl, err);
  }

  // group registers el (a fieldset of rows, say) under path, its error shown in the element it returns.
  group(path, el) {
    const err = h("p", { class: "field-error", id: idFor(this.prefix, path) + "-error", hidden: true });
    register(el, path, err, null);
    return err;
  }

  // clear removes every error shown.
  clear() {
    for (const el of this.form.querySelectorAll("[data-field]")) {
      el.removeAttribute("aria-invalid");
      const err = document.getElementById(el.dataset.error);
      if (err) {
        err.hidden = true;
        err.textContent = "";
      }
    }
    this.top.hidden = true;
    this.top.replaceChildren();
    this.status.textContent = "";
  }

  // find returns the registered element for an API field path, or for the nearest path above it
  // ("headers.X-Y" -> "headers", "allowed_publishers[2]" -> "allowed_publishers").
  find(path) {
    const byPath = new Map();
    for (const el of this.form.querySelectorAll("[data-field]")) byPath.set(el.dataset.field, el);
    for (let p = path; p; ) {
      if (byPath.has(p)) return byPath.get(p);
      const q = p.replace(/\[\d+\]$/, "");
      if (q !== p) {
        p = q;
        continue;
      }
      const i = p.lastIndexOf(".");
      if (i < 0) return null;
      p = p.slice(0, i);
    }
    return null;
  }

  // showError shows err: each field error beside its field, the rest (and problems of other objects a
  // change would break) at the top; focus goes to the first field in error, or to the top.
  showError(err) {
    this.clear();
    const unplaced = [];
    let first = null;
    const fields = err instanceof APIError ? err.fields : [];
    for (const f of fields) {
      const el = this.find(f.field);
      const slot = el && document.getElementById(el.dataset.error);
      if (!slot || el.closest("[hidden]")) {
        unplaced.push(`${f.field}: ${f.message}`);
        continue;
      }
      el.setAttribute("aria-invalid", "true");
      // The field's own path is said when the error was found for a path below it.
      slot.append(h("span", {}, f.field === el.dataset.field ? f.message : `${f.field}: ${f.message}`));
      slot.hidden = false;
      first = first || el;
    }
    const lines = [];
    if (fields.length === 0 || unplaced.length > 0 || !first) {
      lines.push(h("p", {}, saveFailed(err)));
    } else {
      const n = fields.length - unplaced.length;
      lines.push(h("p", {}, `Not saved: the API refused ${n === 1 ? "a field" : n + " fields"}; see beside ${n === 1 ? "it" : "them"}.`));
    }
    const more = [...unplaced, ...(err instanceof APIError ? err.problems : [])];
    if (more.length > 0) lines.push(h("ul", {}, more.map((m) => h("li", {}, m))));
    replace(this.top, lines);
    this.top.hidden = false;
    const target = first ? focusable(first) : this.top;
    target.focus();
  }

  // saved says the save succeeded.
  saved(text) {
    this.top.hidden = true;
    this.status.textContent = text;
  }
}

function register(el, path, err, hint) {
  el.dataset.field = path;
  el.dataset.error = err.id;
  const ids = [hint && hint.id, err.id].filter(Boolean);
  const prev = el.getAttribute("aria-describedby");
  el.setAttribute("aria-describedby", [prev, ...ids].filter(Boolean).join(" "));
}

function focusable(el) {
  if (el.matches("input, select, textarea, button")) return el;
  return el.querySelector("input, select, textarea, button") || el;
}

function saveFailed(err) {
  if (err instanceof Unreachable) return "Not saved: the control plane is unreachable.";
  if (err instanceof APIError) {
    if (err.status === 409) return "Not saved (conflict): " + err.message;
    if (err.status === 422) return "Not saved: " + err.message;
    return "Not saved: " + err.message;
  }
  return "Not saved: " + describe(err);
}

// text returns a text input.
export function text(attrs = {}) {
  return h("input", { type: "text", autocomplete: "off", spellcheck: "false", ...attrs });
}

// number returns a text input for a number: the browser does not swallow what does not parse (a number
// input would), so the API says what is wrong with it.
export function number(attrs = {}) {
  return h("input", { type: "text", inputmode: "decimal", autocomplete: "off", ...attrs });
}

// numberValue is an input's value for the API: undefined when blank (the API applies its default), a
// number when it is one, else the text as typed (which the API refuses, beside the field).
export function numberValue(input) {
  const v = input.value.trim();
  if (v === "") return undefined;
  if (/^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(v) && Number.isFinite(Number(v))) return Number(v);
  return v;
}

// stringValue is an input's trimmed value, or undefined when blank.
export function stringValue(input) {
  const v = input.value.trim();
  return v === "" ? undefined : v;
}

// linesValue is a textarea's non-blank lines, or undefined when there are none.
export function linesValue(textarea) {
  const lines = textarea.value.split("\n").map((l) => l.trim()).filter((l) => l !== "");
  return lines.length ? lines : undefined;
}

// prune drops the undefined members of o.
export function prune(o) {
  for (const k of Object.keys(o)) if (o[k] === undefined) delete o[k];
  return o;
}

// show formats a value the API returned for an input ("" for none).
export function show(v) {
  return v === undefined || v === null ? "" : String(v);
}
