// Counter stand-in: counts per tag set, as the k6 summary's sub-metrics would.
export const registry = {};
export class Counter {
  constructor(name) {
    this.name = name;
    registry[name] = registry[name] || { total: 0, byTags: {} };
  }
  add(v, tags) {
    const m = registry[this.name];
    m.total += v;
    if (tags) {
      for (const k of Object.keys(tags)) {
        const key = this.name + '{' + k + ':' + tags[k] + '}';
        m.byTags[key] = (m.byTags[key] || 0) + v;
      }
    }
  }
}
