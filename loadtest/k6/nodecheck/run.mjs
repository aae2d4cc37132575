// Runs a k6 scenario script with node and curl instead of k6, sequentially (one request at a
// time), to check its logic against a live endpoint: node --import ./register.mjs run.mjs
// ../shared-prefix.js. Environment variables become __ENV. MAX_ITERATIONS caps the requests.
// This is not k6: no concurrency, no k6 metrics; it only proves the scripts build sane
// requests and read the answers.
import { pathToFileURL } from 'node:url';
import path from 'node:path';

globalThis.__ENV = { ...process.env };
const script = pathToFileURL(path.resolve(process.argv[2])).href;
const exec = (await import('k6/execution')).default;
const { registry } = await import('k6/metrics');
const { checks } = await import('k6');
const { durations } = await import('k6/http');

const first = await import(script + '?vu=1');
const sc = Object.values(first.options.scenarios)[0];
const cap = Number(process.env.MAX_ITERATIONS || '1000000');
let n = 0;
if (sc.executor === 'per-vu-iterations') {
  // One module instance per VU, so per-VU state (a user's history) stays apart; rounds go
  // user by user, interleaved, as concurrent VUs would.
  const vus = [first];
  for (let v = 2; v <= sc.vus; v++) {
    vus.push(await import(script + '?vu=' + v));
  }
  for (let it = 0; it < sc.iterations; it++) {
    for (let v = 1; v <= sc.vus && n < cap; v++, n++) {
      exec.vu.idInTest = v;
      exec.vu.iterationInScenario = it;
      vus[v - 1].default();
    }
  }
} else {
  // shared-iterations has iterations; constant-arrival-rate sends rate × duration.
  const planned = sc.iterations || sc.rate * parseInt(sc.duration, 10);
  const total = Math.min(planned, cap);
  for (let i = 0; i < total; i++, n++) {
    exec.scenario.iterationInTest = i;
    first.default();
  }
}
const metrics = {};
for (const [name, m] of Object.entries(registry)) {
  metrics[name] = { values: { count: m.total } };
  for (const [key, c] of Object.entries(m.byTags)) {
    metrics[key] = { values: { count: c } };
  }
}
durations.sort((a, b) => a - b);
metrics['http_req_duration'] = { values: { med: durations[Math.floor(durations.length / 2)], max: durations[durations.length - 1] } };
// handleSummary prints its lines to the console and returns nothing, so k6 adds its own summary.
if (first.handleSummary({ metrics }) !== undefined) {
  console.error('handleSummary returned a value: k6 would print it instead of its own summary');
  process.exit(1);
}
process.stdout.write('iterations: ' + n + ', checks passed ' + checks.pass + ', failed ' + checks.fail + '\n');
process.exit(checks.fail > 0 ? 1 : 0);
