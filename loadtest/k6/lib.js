// Shared helpers of Rolter's k6 scripts. Pure JavaScript (no k6 imports), so it can be checked
// and exercised with node as well.
//
// Text is made of three-letter words; with the sim's tokenizer (rolter sim) every word is
// exactly one token, so a token count is hit exactly, as in the Go harness (package loadtest).
// The first word(s) of a text that must differ spell its id, so unrelated prompts share no
// KV block. The PRNG differs from the Go harness's, so the words differ; the shapes match.

export const WORD_SPACE = 26 * 26 * 26;

// mulberry32: a small deterministic PRNG; returns a function giving floats in [0, 1).
export function prng(seed) {
  let a = seed >>> 0;
  return function () {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// idWidth is the number of words that spell ids 0..n-1 apart.
export function idWidth(n) {
  let w = 1;
  for (let c = WORD_SPACE; c < n; c *= WORD_SPACE) {
    w++;
  }
  return w;
}

function word(v) {
  return (
    String.fromCharCode(97 + Math.floor(v / 676)) +
    String.fromCharCode(97 + (Math.floor(v / 26) % 26)) +
    String.fromCharCode(97 + (v % 26))
  );
}

// words returns n one-token words; when id >= 0 the first `width` words spell id.
export function words(rand, n, id, width) {
  const out = [];
  if (id >= 0) {
    const digits = [];
    let v = id;
    for (let i = 0; i < width; i++) {
      digits.unshift(v % WORD_SPACE);
      v = Math.floor(v / WORD_SPACE);
    }
    for (let k = 0; k < width && out.length < n; k++) {
      out.push(word(digits[k]));
    }
  }
  while (out.length < n) {
    out.push(word(Math.floor(rand() * WORD_SPACE)));
  }
  return out.join(' ');
}

// shuffle shuffles a in place (Fisher-Yates) with rand.
export function shuffle(rand, a) {
  for (let i = a.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    const t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
  return a;
}

// zipfSampler returns a function drawing group indexes 0..n-1 with P(k) ∝ 1/(k+1)^s.
export function zipfSampler(rand, n, s) {
  const cdf = [];
  let sum = 0;
  for (let k = 0; k < n; k++) {
    sum += 1 / Math.pow(k + 1, s);
    cdf.push(sum);
  }
  return function () {
    const x = rand() * sum;
    let lo = 0;
    let hi = n - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (cdf[mid] < x) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  };
}

// isLoopbackURL reports whether url points at 127.0.0.0/8, ::1 or localhost.
export function isLoopbackURL(url) {
  const m = /^https?:\/\/(\[[^\]]+\]|[^/:?#]+)(:\d+)?(\/|$|\?|#)/i.exec(url);
  if (!m) {
    return false;
  }
  const host = m[1].toLowerCase();
  if (host === 'localhost' || host === '[::1]') {
    return true;
  }
  const ip = /^127\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(host);
  return ip !== null && ip.slice(1).every((x) => Number(x) <= 255);
}

// chatBody builds a /v1/chat/completions request body.
export function chatBody(model, messages, maxTokens, stream) {
  const body = { model: model, messages: messages, max_tokens: maxTokens, stream: stream };
  if (stream) {
    body.stream_options = { include_usage: true };
  }
  return JSON.stringify(body);
}

// parseReply reads a completion response body (JSON, or SSE when stream is true) and returns
// { ok, error, content, promptTokens, cachedTokens, completionTokens }.
export function parseReply(body, stream) {
  const r = { ok: false, error: '', content: '', promptTokens: 0, cachedTokens: 0, completionTokens: 0 };
  const takeUsage = (u) => {
    if (u && typeof u === 'object') {
      r.promptTokens = u.prompt_tokens || 0;
      r.completionTokens = u.completion_tokens || 0;
      r.cachedTokens = (u.prompt_tokens_details && u.prompt_tokens_details.cached_tokens) || 0;
    }
  };
  if (typeof body !== 'string') {
    r.error = 'no body';
    return r;
  }
  try {
    if (!stream) {
      const v = JSON.parse(body);
      if (v.error) {
        r.error = String(v.error.message || 'error');
        return r;
      }
      const ch = v.choices && v.choices[0];
      r.content = (ch && ch.message && ch.message.content) || '';
      takeUsage(v.usage);
      r.ok = true;
      return r;
    }
    let done = false;
    for (const raw of body.split('\n')) {
      const line = raw.replace(/\r$/, '');
      if (!line.startsWith('data:')) {
        continue;
      }
      const data = line.slice(5).trim();
      if (data === '[DONE]') {
        done = true;
        break;
      }
      const v = JSON.parse(data);
      if (v.error) {
        r.error = String(v.error.message || 'error event');
        return r;
      }
      const ch = v.choices && v.choices[0];
      if (ch && ch.delta && typeof ch.delta.content === 'string') {
        r.content += ch.delta.content;
      }
      takeUsage(v.usage);
    }
    if (!done) {
      r.error = 'stream ended without data: [DONE]';
      return r;
    }
    r.ok = true;
  } catch (e) {
    r.error = 'cannot parse response: ' + e;
  }
  return r;
}

// intEnv reads a positive integer from env[name], or def.
export function intEnv(env, name, def) {
  const v = env[name];
  if (v === undefined || v === '') {
    return def;
  }
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) {
    throw new Error(name + ' must be a non-negative integer, got ' + JSON.stringify(v));
  }
  return n;
}

// hitRateSummary renders the end-of-test lines from k6's summary data.
export function hitRateSummary(data) {
  const m = data.metrics;
  const count = (name) => (m[name] && m[name].values && m[name].values.count) || 0;
  const prompt = count('rolter_prompt_tokens');
  const cached = count('rolter_cached_tokens');
  const lines = [];
  lines.push('token hit rate: ' + (prompt > 0 ? (cached / prompt).toFixed(3) : 'n/a') + ' (' + cached + ' of ' + prompt + ' prompt tokens cached)');
  const shares = [];
  for (const name of Object.keys(m)) {
    const t = /^rolter_target_requests\{target:(.*)\}$/.exec(name);
    if (t) {
      shares.push([t[1], count(name)]);
    }
  }
  if (shares.length > 0) {
    const counts = shares.map((s) => s[1]);
    const lo = Math.min(...counts);
    const hi = Math.max(...counts);
    lines.push('requests per target: ' + shares.map((s) => s[0] + ' ' + s[1]).join(', '));
    lines.push('share max/min: ' + (lo > 0 ? (hi / lo).toFixed(2) : 'infinite (an expected target got no request)'));
  }
  return lines.join('\n') + '\n';
}
