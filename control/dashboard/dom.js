// Building the page without innerHTML: data from the API always goes in as text, never as markup.

const SVG = "http://www.w3.org/2000/svg"; // the SVG namespace name (a constant, nothing is fetched)

// Properties set after the children are in (a <select>'s value needs its options first).
const PROPS = new Set(["value", "checked", "selected", "indeterminate"]);

function build(el, attrs, children) {
  const props = [];
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") {
      el.addEventListener(k.slice(2), v);
    } else if (k === "class") {
      el.setAttribute("class", Array.isArray(v) ? v.filter(Boolean).join(" ") : v);
    } else if (k === "dataset") {
      Object.assign(el.dataset, v);
    } else if (PROPS.has(k)) {
      props.push([k, v]);
    } else {
      el.setAttribute(k, v === true ? "" : String(v));
    }
  }
  append(el, children);
  for (const [k, v] of props) el[k] = v;
  return el;
}

// h returns a new HTML element: h("p", {class: "hint"}, "text", child, ...). Attributes that are false,
// null or undefined are left out; on<event> functions become listeners.
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

// svg returns a new SVG element, as h.
export function svg(tag, attrs, ...children) {
  return build(document.createElementNS(SVG, tag), attrs, children);
}

// append adds children (nodes, strings, numbers, arrays of them; null and false are skipped).
export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

// replace empties el and appends children.
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

// clock formats a time as HH:MM:SS, the user's local time.
export function clock(d) {
  const p = (n) => String(n).padStart(2, "0");
  return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

// when formats an RFC 3339 time from the API for a table ("" stays "").
export function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  const p = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${clock(d)}`;
}

// idFor turns an API field path into an element id: "kv_events.endpoint" -> "p-kv_events-endpoint".
export function idFor(prefix, path) {
  return prefix + "-" + path.replace(/[^A-Za-z0-9_]+/g, "-").replace(/-+$/, "");
}

// table returns a table whose cells carry their column's name (data-label), so a narrow window shows each
// row as a card of "label: value" lines (dashboard.css).
export function table(caption, columns, rows) {
  return h("div", { class: "table-wrap" },
    h("table", { class: "cards" },
      caption ? h("caption", {}, caption) : null,
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, rows.map((cells) => h("tr", {}, cells.map((c, i) =>
        c instanceof HTMLTableCellElement ? labelled(c, columns[i]) : h("td", { "data-label": columns[i] }, c)))))));
}

function labelled(td, label) {
  if (!td.hasAttribute("data-label")) td.setAttribute("data-label", label);
  return td;
}

// confirmButton is a button that asks once more before it acts: the first press shows "label?" with a
// confirm and a cancel button, all reachable by keyboard; no window.confirm.
export function confirmButton(label, confirmLabel, act) {
  const wrap = h("span", { class: "confirm" });
  const first = h("button", { type: "button", class: "danger", onclick: () => ask() }, label);
  const ask = () => {
    const yes = h("button", { type: "button", class: "danger", onclick: async () => { yes.disabled = true; await act(); } }, confirmLabel);
    const no = h("button", { type: "button", onclick: () => { replace(wrap, first); first.focus(); } }, "Cancel");
    replace(wrap, yes, " ", no);
    yes.focus();
  };
  return append(wrap, [first]);
}
