// Two swiftlet-server instances behind nginx with the shipped configuration
// (deploy/nginx/swiftlet.conf), driven by the official openai client: a conversation stays on one
// instance (and reuses its prefix cache), conversations spread over both, streaming passes
// through, and a stopped instance leaves the rotation without a failed request.
//
//   SWIFTLET_SERVER=build/bin/swiftlet-server SWIFTLET_REPACK=build/bin/swiftlet-repack \
//     node --test tests/server/load_balancer.test.mjs      (from the source root; ctest does this)
//
// Needs nginx (Debian: nginx-light, installed by scripts/install-deps.sh); NGINX overrides its path.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { startServer, sleep, oracles } from './helpers.mjs';

const { OpenAI } = oracles('openai');

const NGINX = process.env.NGINX || ['/usr/sbin/nginx', '/usr/local/sbin/nginx'].find((p) => existsSync(p));
const servers = [];
let lb;  // { proc, base, dir }

async function freePort() {
  const srv = net.createServer();
  await new Promise((resolve) => srv.listen(0, '127.0.0.1', resolve));
  const { port } = srv.address();
  await new Promise((resolve) => srv.close(resolve));
  return port;
}

// The shipped file with the test's addresses, inside a minimal main configuration that keeps
// every file nginx writes in a temporary folder.
function nginxConfig(dir, port, upstreams) {
  let site = readFileSync(path.resolve('deploy/nginx/swiftlet.conf'), 'utf8');
  const lines = site.match(/^\s*server 127\.0\.0\.1:\d+ .*$/gm);
  assert.equal(lines.length, 2, 'the shipped configuration lists two instances');
  lines.forEach((line, i) => { site = site.replace(line, line.replace(/127\.0\.0\.1:\d+/, `127.0.0.1:${upstreams[i]}`)); });
  assert.match(site, /^\s*listen 8080;$/m);
  site = site.replace(/^(\s*)listen 8080;$/m, `$1listen 127.0.0.1:${port};`);
  writeFileSync(path.join(dir, 'swiftlet.conf'), site);
  const temp = ['client_body', 'proxy', 'fastcgi', 'uwsgi', 'scgi']
    .map((t) => `  ${t}_temp_path ${path.join(dir, t)};`).join('\n');
  const user = process.getuid && process.getuid() === 0 ? 'user root;\n' : '';
  return `${user}daemon off;\npid ${path.join(dir, 'nginx.pid')};\nerror_log ${path.join(dir, 'error.log')} warn;\n` +
         `events { worker_connections 256; }\nhttp {\n  access_log off;\n${temp}\n  include ${path.join(dir, 'swiftlet.conf')};\n}\n`;
}

async function startNginx(upstreams) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'swiftlet-nginx-test-'));
  chmodSync(dir, 0o755);
  const port = await freePort();
  writeFileSync(path.join(dir, 'nginx.conf'), nginxConfig(dir, port, upstreams));
  const proc = spawn(NGINX, ['-p', dir, '-c', path.join(dir, 'nginx.conf')], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  const base = `http://127.0.0.1:${port}`;
  for (const deadline = Date.now() + 20000; ;) {
    const r = await fetch(base + '/health').catch(() => null);
    if (r && r.status === 200) break;
    if (proc.exitCode !== null || Date.now() > deadline) {
      const log = existsSync(path.join(dir, 'error.log')) ? readFileSync(path.join(dir, 'error.log'), 'utf8') : '';
      throw new Error(`nginx did not come up:\n${stderr}\n${log}`);
    }
    await sleep(50);
  }
  return { proc, base, dir };
}

before(async () => {
  if (!NGINX) return;
  servers.push(await startServer({ args: ['--parallel', '1'] }), await startServer({ args: ['--parallel', '1'] }));
  lb = await startNginx(servers.map((s) => s.port));
});

after(async () => {
  for (const s of servers) await s.stop();
  if (lb) {
    lb.proc.kill('SIGQUIT');
    await Promise.race([new Promise((resolve) => lb.proc.once('exit', resolve)), sleep(5000)]);
    if (lb.proc.exitCode === null) lb.proc.kill('SIGKILL');
    rmSync(lb.dir, { recursive: true, force: true });
  }
});

const skip = NGINX ? false : 'nginx is not installed (apt-get install nginx-light)';

function clientFor(session) {
  return new OpenAI({ baseURL: lb.base + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 60000,
                      defaultHeaders: session ? { 'X-Session-Id': session } : {} });
}

// One turn: the answer, its usage and the instance that served it (X-Swiftlet-Upstream).
async function turn(client, messages) {
  const { data, response } = await client.chat.completions
    .create({ model: 'tiny', messages, max_tokens: 6, temperature: 0 }).withResponse();
  return { text: data.choices[0].message.content, usage: data.usage, upstream: response.headers.get('x-swiftlet-upstream') };
}

const portOf = (upstream) => Number(upstream.split(':').pop());

test('a conversation stays on one instance and reuses its prefix cache', { skip }, async () => {
  const client = clientFor('conversation-1');
  const messages = [{ role: 'user', content: 'Tell me about the sea and its tides.' }];
  const seen = [];
  for (let i = 0; i < 3; ++i) {
    const t = await turn(client, messages);
    seen.push(t);
    messages.push({ role: 'assistant', content: t.text }, { role: 'user', content: `And question ${i + 2}?` });
  }
  assert.ok(seen[0].upstream, 'nginx names the instance');
  assert.ok(servers.some((s) => s.port === portOf(seen[0].upstream)), seen[0].upstream);
  for (const t of seen) assert.equal(t.upstream, seen[0].upstream, 'every turn on the same instance');
  for (const t of seen.slice(1))
    assert.ok(t.usage.prompt_tokens_details.cached_tokens > 0, `later turns reuse the prefix: ${JSON.stringify(t.usage)}`);
});

test('conversations spread over both instances', { skip }, async () => {
  const used = new Set();
  for (let i = 0; i < 16; ++i)
    used.add((await turn(clientFor(`spread-${i}`), [{ role: 'user', content: 'Hi' }])).upstream);
  assert.equal(used.size, 2, `16 sessions used ${[...used].join(', ')}`);
});

test('streaming passes through nginx unbuffered', { skip }, async () => {
  const stream = await clientFor('stream-1').chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'Count.' }], max_tokens: 12, temperature: 0, stream: true });
  let chunks = 0;
  let finish = null;
  for await (const c of stream) {
    ++chunks;
    if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
  }
  assert.ok(chunks >= 3, `${chunks} chunks`);
  assert.equal(finish, 'length');
});

test('a stopped instance leaves the rotation; its conversations move without an error', { skip }, async () => {
  const client = clientFor('conversation-2');
  const messages = [{ role: 'user', content: 'What is a harbour?' }];
  const first = await turn(client, messages);
  const owner = servers.find((s) => s.port === portOf(first.upstream));
  const other = servers.find((s) => s !== owner);
  assert.deepEqual(await owner.stop(), { code: 0, signal: null });
  servers.splice(servers.indexOf(owner), 1);

  messages.push({ role: 'assistant', content: first.text }, { role: 'user', content: 'And a port?' });
  const moved = await turn(client, messages);
  assert.equal(portOf(moved.upstream.split(',').pop().trim()), other.port, `served by ${moved.upstream}`);
  const health = await fetch(lb.base + '/health');
  assert.equal(health.status, 200);
  assert.equal(portOf(health.headers.get('x-swiftlet-upstream')), other.port);
  for (let i = 0; i < 6; ++i) {
    const t = await turn(clientFor(`after-stop-${i}`), [{ role: 'user', content: 'Hi' }]);
    assert.equal(portOf(t.upstream), other.port, 'every session on the instance that is left');
  }
});
