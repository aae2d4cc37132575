// multi-turn: production-stack's multi-round QA shape. USERS users (one VU each, so each user
// is its own closed loop), ROUNDS rounds; the system prompt is SYSTEM_TOKENS shared by all
// users plus HISTORY_TOKENS of the user's own; every round adds a QUESTION_TOKENS question and
// sends the whole history, after the previous answer arrived. RATE does not apply here.
//
//   k6 run -e URL=http://127.0.0.1:8080 -e USERS=32 -e ROUNDS=8 loadtest/k6/multi-turn.js
import exec from 'k6/execution';
import { cfg, targetThresholds, send, summary } from './common.js';
import { prng, words, idWidth, intEnv } from './lib.js';

const users = intEnv(__ENV, 'USERS', 32);
const rounds = intEnv(__ENV, 'ROUNDS', 8);
const systemTokens = intEnv(__ENV, 'SYSTEM_TOKENS', 512);
const historyTokens = intEnv(__ENV, 'HISTORY_TOKENS', 256);
const questionTokens = intEnv(__ENV, 'QUESTION_TOKENS', 32);
if (users < 1 || rounds < 1 || questionTokens < 1) {
  throw new Error('USERS, ROUNDS and QUESTION_TOKENS must be at least 1');
}

const shared = words(prng(cfg.seed * 1000003 + 1), systemTokens, -1, 0);

export const options = {
  scenarios: {
    users: { executor: 'per-vu-iterations', vus: users, iterations: rounds, maxDuration: cfg.maxDuration },
  },
  thresholds: targetThresholds(),
};

// Per VU (one VU = one user): the conversation so far.
let history = null;
let stopped = false;

export default function () {
  if (stopped) {
    return; // a failed round ends the conversation: later rounds would carry a made-up answer
  }
  const user = exec.vu.idInTest - 1;
  const round = exec.vu.iterationInScenario;
  if (history === null) {
    const own = words(prng(cfg.seed * 104729 + user + 5), historyTokens, user, idWidth(users));
    const system = [shared, own].filter((s) => s !== '').join(' ');
    history = system === '' ? [] : [{ role: 'system', content: system }];
  }
  const q = words(prng(cfg.seed * 7919 + user * rounds + round + 3), questionTokens, user * rounds + round, idWidth(users * rounds));
  history.push({ role: 'user', content: q });
  const reply = send(history);
  if (!reply.ok) {
    stopped = true;
    return;
  }
  history.push({ role: 'assistant', content: reply.content });
}

export function handleSummary(data) {
  return summary(data);
}
