// Sends one chat completion with the OpenAI Node SDK's own retries, against a key whose limit is spent;
// run by engine/limits_test.go. Usage: node ratelimit.mjs <baseURL ending in /v1> <key>. Prints one JSON
// line: whether the SDK got an answer, how long it took, and what the first attempt was told.
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.argv[2], apiKey: process.argv[3], maxRetries: 2, timeout: 30000 });
const start = Date.now();
const out = {};
try {
  const { data, response } = await client.chat.completions
    .create({ model: 'm1', messages: [{ role: 'user', content: 'hello' }], max_tokens: 8 })
    .withResponse();
  out.ok = data.choices.length > 0;
  out.remaining = response.headers.get('x-ratelimit-remaining-requests');
} catch (e) {
  out.ok = false;
  out.error = String(e);
  out.status = e.status;
}
out.ms = Date.now() - start;
console.log(JSON.stringify(out));
