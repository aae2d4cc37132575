// hot-prefix: every request shares one SYSTEM_TOKENS prefix and has a unique QUESTION_TOKENS
// suffix (REQUESTS of them). Watch for an idle replica and the in-flight spread.
//
//   k6 run -e URL=http://127.0.0.1:8080 -e TARGETS=sim-1,sim-2 loadtest/k6/hot-prefix.js
import exec from 'k6/execution';
import { cfg, loadOptions, send, summary } from './common.js';
import { prng, words, idWidth, intEnv } from './lib.js';

const requests = intEnv(__ENV, 'REQUESTS', 512);
const systemTokens = intEnv(__ENV, 'SYSTEM_TOKENS', 2048);
const questionTokens = intEnv(__ENV, 'QUESTION_TOKENS', 32);
if (requests < 1 || systemTokens < 1 || questionTokens < 1) {
  throw new Error('REQUESTS, SYSTEM_TOKENS and QUESTION_TOKENS must be at least 1');
}

const prefix = words(prng(cfg.seed * 1000003 + 1), systemTokens, -1, 0);
const width = idWidth(requests);

export const options = loadOptions(requests);

export default function () {
  const i = exec.scenario.iterationInTest;
  if (i >= requests) {
    return;
  }
  send([
    { role: 'system', content: prefix },
    { role: 'user', content: words(prng(cfg.seed * 7919 + i + 3), questionTokens, i, width) },
  ]);
}

export function handleSummary(data) {
  return summary(data);
}
