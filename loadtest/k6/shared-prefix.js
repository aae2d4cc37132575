// shared-prefix: SGLang's generated-shared-prefix shape. NUM_GROUPS system prompts of
// SYSTEM_TOKENS, PROMPTS_PER_GROUP questions of QUESTION_TOKENS each, OUTPUT_TOKENS out;
// uniform popularity (every group the same count, shuffled) or POPULARITY=zipf (ZIPF_S).
//
//   k6 run -e URL=http://127.0.0.1:8080 -e TARGETS=sim-1,sim-2,sim-3,sim-4 loadtest/k6/shared-prefix.js
import exec from 'k6/execution';
import { cfg, loadOptions, send, summary } from './common.js';
import { prng, words, idWidth, shuffle, zipfSampler, intEnv } from './lib.js';

const groups = intEnv(__ENV, 'NUM_GROUPS', 64);
const perGroup = intEnv(__ENV, 'PROMPTS_PER_GROUP', 16);
const systemTokens = intEnv(__ENV, 'SYSTEM_TOKENS', 512);
const questionTokens = intEnv(__ENV, 'QUESTION_TOKENS', 32);
const popularity = __ENV.POPULARITY || 'uniform';
const zipfS = Number(__ENV.ZIPF_S || '1.1');
if (groups < 1 || perGroup < 1 || systemTokens < 1 || questionTokens < 1) {
  throw new Error('NUM_GROUPS, PROMPTS_PER_GROUP, SYSTEM_TOKENS and QUESTION_TOKENS must be at least 1');
}

// The plan is built in the init context of every VU from the same seed, so all VUs agree.
const textRand = prng(cfg.seed * 1000003 + 1);
const systems = [];
for (let g = 0; g < groups; g++) {
  systems.push(words(textRand, systemTokens, g, idWidth(groups)));
}
const orderRand = prng(cfg.seed * 1000003 + 2);
let order = [];
if (popularity === 'zipf') {
  const draw = zipfSampler(orderRand, groups, zipfS);
  for (let i = 0; i < groups * perGroup; i++) {
    order.push(draw());
  }
} else if (popularity === 'uniform') {
  for (let g = 0; g < groups; g++) {
    for (let i = 0; i < perGroup; i++) {
      order.push(g);
    }
  }
  order = shuffle(orderRand, order);
} else {
  throw new Error('POPULARITY must be uniform or zipf, got ' + popularity);
}
const qWidth = idWidth(order.length);

export const options = loadOptions(order.length);

export default function () {
  const i = exec.scenario.iterationInTest;
  if (i >= order.length) {
    return; // an arrival-rate executor may run a few more iterations than planned
  }
  // Each question has its own PRNG stream, so any VU can build request i on its own.
  const question = words(prng(cfg.seed * 7919 + i + 3), questionTokens, i, qWidth);
  send([
    { role: 'system', content: systems[order[i]] },
    { role: 'user', content: question },
  ]);
}

export function handleSummary(data) {
  return summary(data);
}
