// Module resolution hooks for run.mjs: "k6", "k6/http", "k6/metrics" and "k6/execution" resolve
// to the stubs next to this file. Not k6: a way to execute the scripts' logic with node.
const stubs = new URL('./stubs/', import.meta.url);
const names = { k6: 'k6.mjs', 'k6/http': 'http.mjs', 'k6/metrics': 'metrics.mjs', 'k6/execution': 'execution.mjs' };

export async function resolve(specifier, context, next) {
  if (names[specifier]) {
    return { url: new URL(names[specifier], stubs).href, shortCircuit: true };
  }
  return next(specifier, context);
}
