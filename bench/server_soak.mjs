// Soak test for swiftlet-server under abuse: 8 streaming clients hold chats for the whole run
// while a stream of bad requests is mixed in (malformed JSON, wrong types, huge bodies, huge
// max_tokens, thousands of messages, invalid UTF-8, unknown routes, mid-stream disconnects, slow
// clients that never read) and a few hundred idle connections sit open. Prints requests served,
// answers by kind and status, unexpected outcomes, and the server's RSS after warm-up and at
// the end; exits 1 on a crash, an unanswered good request, an unexpected status, or a server
// that no longer answers at the end.
//
//   SWIFTLET_SERVER=build/bin/swiftlet-server SWIFTLET_REPACK=build/bin/swiftlet-repack \
//     node bench/server_soak.mjs [--seconds 600] [--clients 8] [--idle 300] [--json out.json]
//
// Run from the source root. It starts its own server on a tiny synthetic model (loopback only).
// CI runs a short form (tests/CMakeLists.txt: server_soak_short).
import http from 'node:http';
import net from 'node:net';
import { readFileSync, writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { startServer, sleep } from '../tests/server/helpers.mjs';

const { values: opt } = parseArgs({
  options: {
    seconds: { type: 'string', default: '600' },
    clients: { type: 'string', default: '8' },
    idle: { type: 'string', default: '300' },
    json: { type: 'string', default: '' },
  },
});
const SECONDS = Number(opt.seconds), CLIENTS = Number(opt.clients), IDLE = Number(opt.idle);
const KEY = 'sk-soak';
const CTX = 512;

const server = await startServer({ apiKey: KEY, args: ['--ctx', String(CTX), '--parallel', '4', '--max-queue', '64',
                                                      '--http-threads', String(CLIENTS + 40)] });
const rssOf = () => {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${server.proc.pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : 0;
};
const mib = (b) => (b / (1 << 20)).toFixed(1);

// Outcomes: kind -> status (or 'conn-error', 'aborted') -> count; anything unexpected is listed.
const outcomes = {};
const unexpected = [];
let served = 0;
function count(kind, status) {
  outcomes[kind] ??= {};
  outcomes[kind][status] = (outcomes[kind][status] ?? 0) + 1;
}
function expect(kind, status, allowed, detail = '') {
  count(kind, status);
  if (!allowed.includes(status) && unexpected.length < 50) unexpected.push({ kind, status, detail: String(detail).slice(0, 300) });
}

// One HTTP exchange on a fresh connection. Resolves { status, body } or { status: 'conn-error' }.
function request({ method = 'POST', path = '/v1/chat/completions', body = '', headers = {}, onData, timeoutMs = 120000 }) {
  return new Promise((resolve) => {
    const h = { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}`, Connection: 'close', ...headers };
    const req = http.request({ host: '127.0.0.1', port: server.port, method, path, headers: h, agent: false }, (res) => {
      let data = '';
      res.setEncoding('utf8');
      res.on('data', (d) => {
        data += d;
        if (onData && onData(data, req) === false) { req.destroy(); resolve({ status: 'aborted', body: data }); }
      });
      res.on('end', () => resolve({ status: res.statusCode, body: data }));
      res.on('error', () => resolve({ status: 'aborted', body: data }));
    });
    req.setTimeout(timeoutMs, () => { req.destroy(); resolve({ status: 'timeout' }); });
    req.on('error', (e) => resolve({ status: 'conn-error', body: e.message }));
    req.end(body);
  });
}

const chat = (messages, extra = {}) => JSON.stringify({ model: 'tiny', messages, ...extra });
const words = ['sea', 'stone', 'robot', 'rain', 'library', 'train', 'autumn', 'coffee', 'river', 'lamp'];
const sentence = (n) => Array.from({ length: n }, () => words[Math.floor(Math.random() * words.length)]).join(' ');

// A good streaming chat: must end with [DONE] after at least one content delta.
async function goodClient(deadline) {
  while (Date.now() < deadline) {
    const r = await request({ body: chat([{ role: 'user', content: sentence(8) }],
                                         { stream: true, max_tokens: 8 + Math.floor(Math.random() * 24) }) });
    const ok = r.status === 200 && r.body.trimEnd().endsWith('data: [DONE]');
    expect('good stream', r.status === 200 && !ok ? 'incomplete' : r.status, [200], r.body);
    if (ok) ++served;
  }
}

// The bad requests, each with the statuses it may get.
const huge = 'x'.repeat(12 << 20);
const bad = [
  ['malformed JSON', () => request({ body: '{"messages": [' }), [400]],
  ['wrong types', () => request({ body: chat('hello', { max_tokens: 'many' }) }), [400]],
  ['wrong message type', () => request({ body: chat([{ role: 7, content: { a: 1 } }]) }), [400]],
  ['huge body', () => request({ body: huge }), [413, 'conn-error']],
  ['huge max_tokens', () => request({ body: chat([{ role: 'user', content: 'hi' }], { max_tokens: 1e12, stream: true }),
                                      onData: (d) => d.length < 400 }), [200, 400, 'aborted']],
  ['thousands of messages', () => request({ body: chat(Array.from({ length: 3000 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: 'hi' }))) }),
   [400]],
  ['invalid UTF-8', () => request({ body: Buffer.concat([Buffer.from('{"model":"tiny","messages":[{"role":"user","content":"'),
                                                          Buffer.from([0xff, 0xfe, 0xc3, 0x28]), Buffer.from('"}],"max_tokens":2}')]) }),
   [200, 400]],
  ['unknown route', () => request({ method: 'GET', path: '/v1/nope' }), [404]],
  ['wrong key', () => request({ body: chat([{ role: 'user', content: 'hi' }]), headers: { Authorization: 'Bearer nope' } }), [401]],
  ['mid-stream disconnect', () => request({ body: chat([{ role: 'user', content: sentence(4) }], { stream: true, max_tokens: 200 }),
                                            onData: (d) => !d.includes('"content"') }), ['aborted', 200]],
];

// A client that sends a streaming request and never reads; dropped after a while.
async function slowReader() {
  const s = net.connect(server.port, '127.0.0.1');
  s.on('error', () => {});
  const body = chat([{ role: 'user', content: sentence(6) }], { stream: true, max_tokens: 64 });
  s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
  s.pause();
  await sleep(15000);
  s.destroy();
  count('slow non-reader', 'dropped');
}

async function badStream(deadline) {
  let i = 0;
  while (Date.now() < deadline) {
    const [kind, run, allowed] = bad[i++ % bad.length];
    const r = await run();
    expect(kind, r.status, allowed, r.body);
    if (i % bad.length === 0) slowReader();
    await sleep(50);
  }
}

// Idle connections: opened, never written to; the server may close them (keep-alive timeout).
const idle = [];
let idleClosed = 0;
for (let i = 0; i < IDLE; ++i) {
  const s = net.connect(server.port, '127.0.0.1');
  s.on('error', () => {});
  s.on('close', () => { ++idleClosed; });
  idle.push(s);
}

// Warm-up: a few good requests, then the starting RSS.
for (let i = 0; i < 3; ++i) await request({ body: chat([{ role: 'user', content: 'warm up' }], { max_tokens: 16 }) });
const rssStart = rssOf();
const t0 = Date.now();
const deadline = t0 + SECONDS * 1000;
const rssSamples = [];
const sampler = setInterval(() => rssSamples.push({ s: Math.round((Date.now() - t0) / 1000), rss: rssOf() }), 10000);
await Promise.all([...Array.from({ length: CLIENTS }, () => goodClient(deadline)), badStream(deadline)]);
clearInterval(sampler);
await sleep(1000);
const rssEnd = rssOf();

// Still responsive: health at once, and one more good request.
const h0 = Date.now();
const health = await request({ method: 'GET', path: '/health', timeoutMs: 5000 });
const healthMs = Date.now() - h0;
const last = await request({ body: chat([{ role: 'user', content: 'still there?' }], { max_tokens: 4 }), timeoutMs: 30000 });
const alive = server.proc.exitCode === null && server.proc.signalCode === null;
for (const s of idle) s.destroy();
const stderr = server.stderr();
await server.stop();

const report = {
  seconds: SECONDS, clients: CLIENTS, idle_connections: IDLE, idle_closed_by_server: idleClosed,
  good_requests_served: served, outcomes, unexpected,
  rss_start_mib: Number(mib(rssStart)), rss_end_mib: Number(mib(rssEnd)), rss_samples_mib: rssSamples.map((x) => [x.s, Number(mib(x.rss))]),
  health_after: { status: health.status, ms: healthMs }, last_request_status: last.status, server_alive: alive,
  sanitizer_reports: (stderr.match(/ERROR: (Address|Leak|Undefined)Sanitizer/g) ?? []).length,
};
console.log(JSON.stringify(report, null, 1));
if (opt.json) writeFileSync(opt.json, JSON.stringify(report, null, 1));
const failed = unexpected.length > 0 || !alive || health.status !== 200 || last.status !== 200 || served === 0 ||
               report.sanitizer_reports > 0;
if (failed) console.error('soak FAILED\n' + stderr.slice(-4000));
process.exit(failed ? 1 : 0);
