// Drives a Rolter gateway with the official OpenAI Node SDK; run by engine/sdk_test.go.
// Usage: node sdk.mjs <baseURL ending in /v1>. Prints one JSON line of findings; exits 1 on a failed check.
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.argv[2], apiKey: 'sk-dummy', maxRetries: 0, timeout: 20000 });
const out = {};
const fail = (msg) => { console.log(JSON.stringify({ ...out, error: msg })); process.exit(1); };

const chat = await client.chat.completions.create({
  model: 'm',
  messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hello' }],
});
out.chat = chat.choices[0].message.content;
if (chat.object !== 'chat.completion' || !out.chat) fail('bad chat completion');

const { data: withResp, response } = await client.chat.completions
  .create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] })
  .withResponse();
out.target = response.headers.get('x-rolter-target');
out.requestId = response.headers.get('x-request-id');
if (!withResp.choices.length || !out.target || !out.requestId) fail('missing decision headers');

const stream = await client.chat.completions.create({
  model: 'm',
  messages: [{ role: 'user', content: 'stream please' }],
  stream: true,
  stream_options: { include_usage: true },
});
let text = '';
let chunks = 0;
for await (const chunk of stream) {
  chunks++;
  if (chunk.usage) out.usage = chunk.usage;
  text += chunk.choices[0]?.delta?.content ?? '';
}
out.streamText = text;
out.chunks = chunks;
if (!text || !out.usage) fail('bad stream');

const models = await client.models.list();
out.models = models.data.map((m) => m.id);
if (!out.models.includes('m')) fail('model list lacks m');

try {
  await client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] });
  fail('unknown model did not raise');
} catch (e) {
  if (!(e instanceof OpenAI.NotFoundError)) fail('unknown model raised ' + e.constructor.name);
  out.notFound = { status: e.status, code: e.code, type: e.type };
}

// A stream that dies mid-way must raise in the SDK, not end quietly.
try {
  const s = await client.chat.completions.create({ model: 'dying', messages: [{ role: 'user', content: 'x' }], stream: true });
  let got = '';
  for await (const chunk of s) got += chunk.choices[0]?.delta?.content ?? '';
  fail('a stream that died mid-way ended quietly after: ' + got);
} catch (e) {
  if (!(e instanceof OpenAI.APIError)) fail('mid-stream failure raised ' + e.constructor.name);
  out.midStream = { name: e.constructor.name, message: e.message };
}

console.log(JSON.stringify(out));
