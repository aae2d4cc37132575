// k6 plumbing shared by the scenario scripts: configuration from the environment, the loopback
// guard, the request, the custom metrics and the end-of-test summary.
import http from 'k6/http';
import { check } from 'k6';
import { Counter } from 'k6/metrics';
import { chatBody, parseReply, isLoopbackURL, intEnv, hitRateSummary } from './lib.js';

const trimSlash = (s) => s.replace(/\/+$/, '');

export const cfg = {
  url: trimSlash(__ENV.URL || 'http://127.0.0.1:8080'),
  model: __ENV.MODEL || 'sim-model',
  apiKey: __ENV.API_KEY || '',
  seed: intEnv(__ENV, 'SEED', 1),
  concurrency: intEnv(__ENV, 'CONCURRENCY', 8),
  rate: intEnv(__ENV, 'RATE', 0),
  maxDuration: __ENV.DURATION || '2m',
  timeout: __ENV.TIMEOUT || '60s',
  outputTokens: intEnv(__ENV, 'OUTPUT_TOKENS', 64),
  stream: __ENV.STREAM === '1' || __ENV.STREAM === 'true',
  tokenIds: __ENV.TOKEN_IDS === '1' || __ENV.TOKEN_IDS === 'true',
  tokenizeUrl: trimSlash(__ENV.TOKENIZE_URL || __ENV.URL || 'http://127.0.0.1:8080'),
  targets: (__ENV.TARGETS || '').split(',').map((s) => s.trim()).filter((s) => s !== ''),
  allowRemote: __ENV.ALLOW_REMOTE === '1' || __ENV.ALLOW_REMOTE === 'true',
};

// Loopback only unless ALLOW_REMOTE=1: throwing in the init context stops k6 before any request.
if (!cfg.allowRemote && !(isLoopbackURL(cfg.url) && isLoopbackURL(cfg.tokenizeUrl))) {
  throw new Error('refusing to load-test ' + cfg.url + ' / ' + cfg.tokenizeUrl + ': not a loopback address (set ALLOW_REMOTE=1 to allow it)');
}
if (cfg.concurrency < 1) {
  throw new Error('CONCURRENCY must be at least 1');
}

export const promptTokens = new Counter('rolter_prompt_tokens');
export const cachedTokens = new Counter('rolter_cached_tokens');
export const targetRequests = new Counter('rolter_target_requests');
export const decisions = new Counter('rolter_decisions');
export const failures = new Counter('rolter_failed_requests');

// loadOptions returns k6 options that send `iterations` requests: closed loop (CONCURRENCY VUs
// sharing the iterations) or, with RATE > 0, open loop at RATE requests/s for
// ceil(iterations / RATE) seconds. Both stop at DURATION at the latest.
export function loadOptions(iterations) {
  let scenario;
  if (cfg.rate > 0) {
    scenario = {
      executor: 'constant-arrival-rate',
      rate: cfg.rate,
      timeUnit: '1s',
      duration: Math.max(1, Math.ceil(iterations / cfg.rate)) + 's',
      preAllocatedVUs: cfg.concurrency,
      maxVUs: cfg.concurrency,
      gracefulStop: '30s',
    };
  } else {
    scenario = {
      executor: 'shared-iterations',
      vus: Math.min(cfg.concurrency, iterations),
      iterations: iterations,
      maxDuration: cfg.maxDuration,
    };
  }
  return { scenarios: { load: scenario }, thresholds: targetThresholds(), discardResponseBodies: false };
}

// targetThresholds makes k6 keep one sub-metric per expected target (TARGETS=sim-1,sim-2), so
// the summary can report the per-target share. The thresholds themselves always pass.
export function targetThresholds() {
  const t = {};
  for (const name of cfg.targets) {
    t['rolter_target_requests{target:' + name + '}'] = ['count>=0'];
  }
  t['rolter_failed_requests'] = ['count>=0'];
  return t;
}

const tokenCache = {}; // per VU: prompt -> "1,2,3"

// tokenIdsFor asks the engine's /tokenize for the ids of messages, cached per prompt, as a
// client of a vLLM fleet feeding precise_cache_aware would.
function tokenIdsFor(messages) {
  const body = JSON.stringify({ model: cfg.model, messages: messages, add_generation_prompt: true });
  if (tokenCache[body] !== undefined) {
    return tokenCache[body];
  }
  const res = http.post(cfg.tokenizeUrl + '/tokenize', body, {
    headers: { 'Content-Type': 'application/json' },
    timeout: cfg.timeout,
    tags: { name: 'tokenize' },
  });
  if (res.status !== 200) {
    throw new Error('cannot tokenize at ' + cfg.tokenizeUrl + ': status ' + res.status);
  }
  const ids = res.json('tokens').join(',');
  tokenCache[body] = ids;
  return ids;
}

// send posts one chat completion and records tokens, target and decision. It returns the
// parsed reply ({ ok, content, ... }).
export function send(messages) {
  const headers = { 'Content-Type': 'application/json' };
  if (cfg.apiKey !== '') {
    headers['Authorization'] = 'Bearer ' + cfg.apiKey;
  }
  if (cfg.tokenIds) {
    headers['x-rolter-vllm-token-ids'] = tokenIdsFor(messages);
  }
  const res = http.post(cfg.url + '/v1/chat/completions', chatBody(cfg.model, messages, cfg.outputTokens, cfg.stream), {
    headers: headers,
    timeout: cfg.timeout,
    tags: { name: 'chat' },
  });
  const reply = res.status === 200 ? parseReply(res.body, cfg.stream) : { ok: false, error: 'status ' + res.status };
  check(res, { 'status is 200': (r) => r.status === 200, 'reply parsed': () => reply.ok });
  if (!reply.ok) {
    failures.add(1);
    return reply;
  }
  promptTokens.add(reply.promptTokens);
  cachedTokens.add(reply.cachedTokens);
  const target = res.headers['X-Rolter-Target'];
  if (target) {
    targetRequests.add(1, { target: target });
  }
  const decision = res.headers['X-Rolter-Decision'];
  if (decision) {
    decisions.add(1, { decision: decision });
  }
  return reply;
}

// summary is the scripts' handleSummary. It adds to k6's own end-of-test summary instead of replacing it:
// the Rolter lines (latency percentiles, failures, the token hit rate and the per-target share) go to the
// console, and handleSummary returns nothing, which makes k6 print its default summary as without one
// (and write --summary-export, when given, as usual).
export function summary(data) {
  const d = data.metrics['http_req_duration{name:chat}'] || data.metrics.http_req_duration;
  const v = (d && d.values) || {};
  const fmt = (x) => (typeof x === 'number' ? x.toFixed(1) + ' ms' : 'n/a');
  let text = 'rolter k6 summary (' + cfg.url + ')\n';
  text += 'chat latency: p50 ' + fmt(v.med) + ', p90 ' + fmt(v['p(90)']) + ', p95 ' + fmt(v['p(95)']) + ', max ' + fmt(v.max) + '\n';
  const failed = data.metrics.rolter_failed_requests;
  text += 'failed requests: ' + ((failed && failed.values.count) || 0) + '\n';
  text += hitRateSummary(data);
  for (const line of text.trimEnd().split('\n')) {
    console.log(line);
  }
  return undefined;
}
