// Filter, sort and page a long list of cards (queues, exchanges): only the page shown
// is built and updated, so a broker with thousands of queues costs what one page costs.
//
// Hooks: the toolbar is .list-tools[data-list=<name>] with input[data-role=filter],
// select[data-role=sort], button[data-role=order] (data-order asc|desc),
// select[data-role=page-size], button[data-role=prev|next] and [data-role=range]
// ("51–100 of 1,000"; data-matched and data-total hold the raw numbers).

import { fmtInt, h, setText } from "./util.js";

export class ListView {
  // sorts: [[key, label, (entry, rates) => comparable value, default order]]
  constructor(name, sorts, onChange, pageSize = 25) {
    this.sorts = new Map(sorts.map(([key, label, value, order]) => [key, { label, value, order }]));
    this.onChange = onChange;
    this.filter = "";
    this.sortKey = sorts[0][0];
    this.desc = false;
    this.page = 0;
    this.pageSize = pageSize;

    this.input = h("input", {
      type: "search",
      placeholder: "filter by name",
      "data-role": "filter",
      "aria-label": `filter ${name}`,
    });
    this.input.addEventListener("input", () => {
      this.filter = this.input.value;
      this.page = 0;
      this.onChange();
    });
    this.sort = h(
      "select",
      { "data-role": "sort", "aria-label": `sort ${name} by` },
      ...sorts.map(([key, label]) => h("option", { value: key, text: label })),
    );
    this.sort.addEventListener("change", () => {
      this.sortKey = this.sort.value;
      this.desc = this.sorts.get(this.sortKey).order === "desc";
      this.page = 0;
      this.onChange();
    });
    this.order = h("button", { type: "button", "data-role": "order", class: "ghost" });
    this.order.addEventListener("click", () => {
      this.desc = !this.desc;
      this.onChange();
    });
    this.size = h(
      "select",
      { "data-role": "page-size", "aria-label": "per page" },
      ...[10, 25, 50, 100].map((n) => h("option", { value: String(n), text: `${n} a page` })),
    );
    this.size.value = String(pageSize);
    this.size.addEventListener("change", () => {
      this.pageSize = Number(this.size.value);
      this.page = 0;
      this.onChange();
    });
    this.prev = h("button", { type: "button", "data-role": "prev", class: "ghost", "aria-label": "previous page", text: "‹" });
    this.next = h("button", { type: "button", "data-role": "next", class: "ghost", "aria-label": "next page", text: "›" });
    this.prev.addEventListener("click", () => this.go(this.page - 1));
    this.next.addEventListener("click", () => this.go(this.page + 1));
    this.range = h("span", { class: "range", "data-role": "range" });
    this.el = h(
      "div",
      { class: "list-tools", "data-list": name },
      this.input,
      this.sort,
      this.order,
      this.size,
      h("span", { class: "pager" }, this.prev, this.range, this.next),
    );
    this.showOrder();
  }

  go(page) {
    this.page = page;
    this.onChange();
  }

  showOrder() {
    this.order.dataset.order = this.desc ? "desc" : "asc";
    setText(this.order, this.desc ? "↓" : "↑");
    this.order.title = this.desc ? "descending" : "ascending";
  }

  // entries: [[name, data]]; returns the page to show, in order.
  view(entries, rates) {
    this.showOrder();
    const needle = this.filter.trim().toLowerCase();
    const matched = needle ? entries.filter(([name]) => name.toLowerCase().includes(needle)) : entries.slice();
    const { value } = this.sorts.get(this.sortKey);
    const keyed = matched.map((e) => [value(e, rates), e]);
    const sign = this.desc ? -1 : 1;
    keyed.sort((a, b) => {
      const c = a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0;
      // Ties keep name order whichever way the sort goes: a stable list reads better.
      return c ? sign * c : a[1][0] < b[1][0] ? -1 : a[1][0] > b[1][0] ? 1 : 0;
    });
    const pages = Math.max(1, Math.ceil(keyed.length / this.pageSize));
    this.page = Math.max(0, Math.min(this.page, pages - 1));
    const start = this.page * this.pageSize;
    const shown = keyed.slice(start, start + this.pageSize).map((k) => k[1]);
    this.prev.disabled = this.page === 0;
    this.next.disabled = this.page >= pages - 1;
    this.range.dataset.matched = String(keyed.length);
    this.range.dataset.total = String(entries.length);
    this.range.dataset.page = String(this.page + 1);
    this.range.dataset.pages = String(pages);
    const of = keyed.length === entries.length ? fmtInt(entries.length) : `${fmtInt(keyed.length)} (of ${fmtInt(entries.length)})`;
    setText(this.range, keyed.length ? `${fmtInt(start + 1)}–${fmtInt(start + shown.length)} of ${of}` : `0 of ${of}`);
    // The tools matter once a list outgrows a page or is being filtered.
    this.el.hidden = entries.length <= 10 && !needle;
    return shown;
  }
}
