// http.post stand-in: a synchronous request made with curl (k6's http API is synchronous too).
import { execFileSync } from 'node:child_process';

function canonical(name) {
  return name
    .toLowerCase()
    .split('-')
    .map((p) => p.charAt(0).toUpperCase() + p.slice(1))
    .join('-');
}

export const durations = [];

function post(url, body, params) {
  const args = ['-s', '-i', '-X', 'POST', '--max-time', '60', '--data-binary', '@-', url];
  for (const [k, v] of Object.entries((params && params.headers) || {})) {
    args.push('-H', k + ': ' + v);
  }
  const start = Date.now();
  const out = execFileSync('curl', args, { input: body, maxBuffer: 64 << 20 }).toString();
  durations.push(Date.now() - start);
  const sep = out.indexOf('\r\n\r\n');
  const head = out.slice(0, sep).split('\r\n');
  const res = { status: Number(head[0].split(' ')[1]), headers: {}, body: out.slice(sep + 4) };
  for (const line of head.slice(1)) {
    const i = line.indexOf(':');
    res.headers[canonical(line.slice(0, i))] = line.slice(i + 1).trim();
  }
  res.json = (path) => {
    const v = JSON.parse(res.body);
    return path ? v[path] : v;
  };
  return res;
}

export default { post };
