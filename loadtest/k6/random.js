// random: REQUESTS unrelated prompts of QUESTION_TOKENS tokens each; nothing to share, so the
// token hit rate should stay near 0 whatever the strategy.
//
//   k6 run -e URL=http://127.0.0.1:8080 loadtest/k6/random.js
import exec from 'k6/execution';
import { cfg, loadOptions, send, summary } from './common.js';
import { prng, words, idWidth, intEnv } from './lib.js';

const requests = intEnv(__ENV, 'REQUESTS', 256);
const questionTokens = intEnv(__ENV, 'QUESTION_TOKENS', 544);
if (requests < 1 || questionTokens < 1) {
  throw new Error('REQUESTS and QUESTION_TOKENS must be at least 1');
}
const width = idWidth(requests);

export const options = loadOptions(requests);

export default function () {
  const i = exec.scenario.iterationInTest;
  if (i >= requests) {
    return;
  }
  send([{ role: 'user', content: words(prng(cfg.seed * 7919 + i + 3), questionTokens, i, width) }]);
}

export function handleSummary(data) {
  return summary(data);
}
