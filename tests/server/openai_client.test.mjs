// End-to-end tests of swiftlet-server on loopback, driven by the official `openai` npm client
// (v6), raw HTTP for what a client library hides (half-sent bodies, slow readers, dropped
// connections), and headless Chromium for the chat page.
//
//   SWIFTLET_SERVER=build/bin/swiftlet-server SWIFTLET_REPACK=build/bin/swiftlet-repack \
//     node --test tests/server/openai_client.test.mjs       (from the source root; ctest does this)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { mkdirSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, rawRequest, metrics, connect, sleep, oracles } from './helpers.mjs';

const { OpenAI } = oracles('openai');

const KEY = 'sk-swiftlet-test';
const MODEL = 'tiny';
const CTX = 4096;
let server;
let client;

before(async () => {
  server = await startServer({ apiKey: KEY, args: ['--ctx', String(CTX), '--parallel', '2', '--max-queue', '2'] });
  client = new OpenAI({ baseURL: server.base + '/v1', apiKey: KEY, maxRetries: 0, timeout: 30000 });
});

after(async () => {
  if (!server) return;
  const exit = await server.stop();
  assert.deepEqual(exit, { code: 0, signal: null }, 'the server stops cleanly on SIGTERM');
});

async function assertHealthy() {
  const r = await fetch(server.base + '/health');
  assert.equal(r.status, 200, 'the server keeps serving');
}

// Streams a chat completion through the client and reassembles it.
async function streamChat(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  const out = { chunks: [], text: '', finish: null, usage: null };
  for await (const c of stream) {
    out.chunks.push(c);
    if (c.usage) out.usage = c.usage;
    for (const ch of c.choices) {
      if (ch.delta.content) out.text += ch.delta.content;
      if (ch.finish_reason) out.finish = ch.finish_reason;
    }
  }
  return out;
}

const poem = [{ role: 'user', content: 'Write a short poem about the sea.' }];

test('health and model list', async () => {
  await assertHealthy();
  const models = await client.models.list();
  assert.equal(models.data.length, 1);
  assert.equal(models.data[0].id, MODEL);
  assert.equal(models.data[0].object, 'model');
  assert.equal((await client.models.retrieve(MODEL)).id, MODEL);
});

test('greedy streaming reassembles to the non-streamed answer', async () => {
  const full = await client.chat.completions.create({ model: MODEL, messages: poem, temperature: 0, max_tokens: 24 });
  assert.equal(full.object, 'chat.completion');
  assert.match(full.id, /^chatcmpl-/);
  const answer = full.choices[0].message.content;
  assert.equal(full.choices[0].message.role, 'assistant');
  assert.ok(answer.length > 0);

  const s = await streamChat({ model: MODEL, messages: poem, temperature: 0, max_tokens: 24 });
  assert.deepEqual(s.chunks[0].choices[0].delta, { role: 'assistant', content: '' }, 'the role chunk comes first');
  assert.ok(s.chunks.length > 4, 'the answer came in several deltas');
  assert.equal(s.text, answer);
  assert.equal(s.finish, full.choices[0].finish_reason);
  const withChoices = s.chunks.filter((c) => c.choices.length > 0);
  assert.ok(withChoices.at(-1).choices[0].finish_reason, 'the finish reason is on the last chunk');
  assert.equal(s.chunks.at(-1).choices.length, 0, 'include_usage: a last chunk with the usage and no choices');
  assert.equal(s.usage.prompt_tokens, full.usage.prompt_tokens);
  assert.equal(s.usage.completion_tokens, full.usage.completion_tokens);
});

test('usage numbers add up and max_tokens ends with "length"', async () => {
  const r = await client.chat.completions.create({ model: MODEL, messages: poem, temperature: 0, max_tokens: 3 });
  assert.equal(r.choices[0].finish_reason, 'length');
  const u = r.usage;
  assert.equal(u.completion_tokens, 3);
  assert.ok(u.prompt_tokens > 5);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  assert.equal(u.prompt_tokens_details.cached_tokens + u.prefilled_tokens, u.prompt_tokens);
  assert.equal(u.reused_tokens, u.prompt_tokens_details.cached_tokens);
  assert.ok(r.timings.decode_tokens_per_second >= 0);
  // Picking 3 tokens is part of the request's time, never more than all of it.
  assert.ok(r.timings.sample_ms > 0, `sample_ms ${r.timings.sample_ms}`);
  assert.ok(r.timings.sample_ms <= r.timings.time_to_first_token_ms + r.timings.decode_ms, JSON.stringify(r.timings));

  const s = await streamChat({ model: MODEL, messages: poem, temperature: 0, max_tokens: 3 });
  assert.equal(s.finish, 'length');
  assert.equal(s.usage.completion_tokens, 3);
});

test('stop strings end the answer before the stop', async () => {
  const full = await client.chat.completions.create({ model: MODEL, messages: poem, temperature: 0, max_tokens: 24 });
  const text = full.choices[0].message.content;
  let at = -1, stop = '';
  for (let p = 3; p + 2 <= text.length; ++p) {
    const s = text.slice(p, p + 2);
    if (/^[\x21-\x7e]{2}$/.test(s) && text.indexOf(s) === p) { at = p; stop = s; break; }
  }
  assert.ok(at > 0, `no usable stop string in ${JSON.stringify(text)}`);
  const r = await client.chat.completions.create({ model: MODEL, messages: poem, temperature: 0, max_tokens: 24, stop: [stop, 'never-seen'] });
  assert.equal(r.choices[0].message.content, text.slice(0, at));
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await streamChat({ model: MODEL, messages: poem, temperature: 0, max_tokens: 24, stop });
  assert.equal(s.text, text.slice(0, at));
  assert.equal(s.finish, 'stop');
});

test('completions, streamed and not', async () => {
  const params = { model: MODEL, prompt: 'Once upon a time', max_tokens: 8, temperature: 0 };
  const c = await client.completions.create(params);
  assert.equal(c.object, 'text_completion');
  assert.match(c.id, /^cmpl-/);
  assert.equal(typeof c.choices[0].text, 'string');
  assert.ok(['length', 'stop'].includes(c.choices[0].finish_reason));
  assert.ok(c.usage.completion_tokens <= 8);
  assert.equal(c.usage.total_tokens, c.usage.prompt_tokens + c.usage.completion_tokens);

  const stream = await client.completions.create({ ...params, stream: true });
  let text = '', finish = null;
  for await (const chunk of stream) {
    for (const ch of chunk.choices) {
      text += ch.text;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  assert.equal(text, c.choices[0].text);
  assert.equal(finish, c.choices[0].finish_reason);

  const echoed = await client.completions.create({ ...params, echo: true });
  assert.equal(echoed.choices[0].text, params.prompt + c.choices[0].text);
});

test('a follow-up chat request reuses the prefix', async () => {
  const m1 = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Name three colors.' }];
  const r1 = await client.chat.completions.create({ model: MODEL, messages: m1, temperature: 0, max_tokens: 12 });
  const before = await metrics(server);
  const m2 = [...m1, { role: 'assistant', content: r1.choices[0].message.content }, { role: 'user', content: 'And three more?' }];
  const r2 = await client.chat.completions.create({ model: MODEL, messages: m2, temperature: 0, max_tokens: 12 });
  const cached = r2.usage.prompt_tokens_details.cached_tokens;
  // Everything up to the start of the first answer's turn is kept (the template re-renders
  // that turn without the empty think block it was generated after).
  assert.ok(cached >= r1.usage.prompt_tokens - 12, `cached ${cached} of a first prompt of ${r1.usage.prompt_tokens}`);
  assert.ok(cached < r2.usage.prompt_tokens);
  assert.equal(r2.usage.prefilled_tokens, r2.usage.prompt_tokens - cached);
  const after = await metrics(server);
  assert.equal(after.swiftlet_prompt_tokens_reused_total - before.swiftlet_prompt_tokens_reused_total, cached);
  assert.equal(after.swiftlet_prompt_tokens_prefilled_total - before.swiftlet_prompt_tokens_prefilled_total,
               r2.usage.prefilled_tokens);
});

test('metrics are Prometheus text', async () => {
  const r = await fetch(server.base + '/metrics', { headers: { Authorization: `Bearer ${KEY}` } });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/plain/);
  const m = await metrics(server);
  for (const name of ['swiftlet_generated_tokens_total', 'swiftlet_requests_total', 'swiftlet_queue_length',
                      'swiftlet_decode_tokens_per_second', 'swiftlet_prefix_cache_hit_ratio', 'swiftlet_expert_cache_hit_ratio',
                      'swiftlet_disk_read_bytes_total', 'swiftlet_peak_resident_memory_bytes', 'swiftlet_requests_running',
                      'swiftlet_batch_size', 'swiftlet_batch_steps_total', 'swiftlet_slot_generated_tokens_total{slot="1"}',
                      'swiftlet_slot_decode_tokens_per_second{slot="0"}'])
    assert.ok(name in m, name);
  assert.ok(m.swiftlet_generated_tokens_total > 0);
  assert.ok(m['swiftlet_http_requests_total{path="/v1/chat/completions",status="200"}'] > 0);
});

// ------------------------------------------------------------------------------- bad input

async function expectError(res, status, { type, code, param } = {}) {
  assert.equal(res.status, status, res.body);
  const j = JSON.parse(res.body);
  assert.equal(typeof j.error.message, 'string');
  assert.ok(j.error.message.length > 0);
  if (type) assert.equal(j.error.type, type);
  if (code) assert.equal(j.error.code, code);
  if (param) assert.equal(j.error.param, param);
  await assertHealthy();
}

const chatBody = (extra) => JSON.stringify({ model: MODEL, messages: poem, max_tokens: 4, ...extra });

test('malformed JSON, wrong types and missing fields are 400s', async () => {
  await expectError(await rawRequest(server, { body: '{"model": "tiny", "messages": [' }), 400, { type: 'invalid_request_error', code: 'invalid_json' });
  await expectError(await rawRequest(server, { body: chatBody({ messages: 'hello' }) }), 400, { param: 'messages', code: 'invalid_type' });
  await expectError(await rawRequest(server, { body: chatBody({ temperature: 'hot' }) }), 400, { param: 'temperature' });
  await expectError(await rawRequest(server, { body: chatBody({ max_tokens: '10' }) }), 400, { param: 'max_tokens' });
  await expectError(await rawRequest(server, { body: chatBody({ stream: 1 }) }), 400, { param: 'stream' });
  await expectError(await rawRequest(server, { body: JSON.stringify({ model: MODEL }) }), 400, { param: 'messages', code: 'missing_required_parameter' });
  await expectError(await rawRequest(server, { path: '/v1/completions', body: JSON.stringify({ model: MODEL }) }), 400, { param: 'prompt' });
  // Unknown fields are ignored.
  const ok = await rawRequest(server, { body: chatBody({ some_new_field: { a: 1 }, temperature: 0 }) });
  assert.equal(ok.status, 200, ok.body);
});

test('n=2 is refused clearly', async () => {
  await assert.rejects(client.chat.completions.create({ model: MODEL, messages: poem, n: 2 }),
                       (e) => e.status === 400 && e.param === 'n' && /n=1/.test(e.message));
  await assertHealthy();
});

test('an unknown model is a 404', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'gpt-4o', messages: poem }),
                       (e) => e.status === 404 && e.code === 'model_not_found');
  await assertHealthy();
});

test('a prompt longer than the context is refused, not truncated', async () => {
  const long = [{ role: 'user', content: 'word '.repeat(CTX * 2) }];
  await assert.rejects(client.chat.completions.create({ model: MODEL, messages: long, max_tokens: 4 }),
                       (e) => e.status === 400 && e.code === 'context_length_exceeded' && /context/.test(e.message));
  await assertHealthy();
});

test('API key, unknown paths', async () => {
  await expectError(await rawRequest(server, { body: chatBody({}), headers: { Authorization: 'Bearer wrong' } }), 401);
  const r = await fetch(server.base + '/v1/models');  // no key
  assert.equal(r.status, 401);
  await expectError(await rawRequest(server, { method: 'GET', path: '/v1/nope' }), 404, { code: 'unknown_url' });
  assert.equal((await fetch(server.base + '/')).status, 200, 'the chat page needs no key');
  await expectError(await rawRequest(server, { method: 'PUT', path: '/v1/models' }), 405);
});

test('a 100 MB body gets 413 without being read', async () => {
  const total = 100 * 1024 * 1024;
  const sent = 1024 * 1024;
  const res = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('no answer: the server waits for the whole body')), 5000);
    const req = http.request({
      host: '127.0.0.1', port: server.port, method: 'POST', path: '/v1/chat/completions',
      headers: { 'Content-Type': 'application/json', 'Content-Length': String(total), Authorization: `Bearer ${KEY}` },
    }, (r) => {
      let body = '';
      r.on('data', (d) => { body += d; });
      r.on('end', () => { clearTimeout(timer); req.destroy(); resolve({ status: r.statusCode, body, headers: r.headers }); });
    });
    req.on('error', () => {});  // the server may close while we would still be sending
    req.write(Buffer.alloc(sent, 0x20));  // 1 MB of the announced 100 MB, then nothing
  });
  assert.equal(res.status, 413);
  assert.equal(JSON.parse(res.body).error.code, 'payload_too_large');
  assert.equal(res.headers.connection, 'close');
  await assertHealthy();
});

test('a full queue answers 429', async () => {
  const long = { model: MODEL, messages: poem, max_tokens: CTX - 40, temperature: 0 };
  const controllers = [];
  const pending = [];
  // Two running (--parallel 2) and two waiting (--max-queue 2) ...
  for (let i = 0; i < 4; ++i) {
    const ac = new AbortController();
    controllers.push(ac);
    pending.push(client.chat.completions.create({ ...long, stream: true }, { signal: ac.signal })
      .then(async (s) => { for await (const _ of s); }).catch(() => {}));
    // Let each reach the queue in order.
    const deadline = Date.now() + 5000;
    while ((await metrics(server)).swiftlet_queue_length + (await metrics(server)).swiftlet_requests_running < i + 1 &&
           Date.now() < deadline) await sleep(10);
  }
  // ... so a fourth is refused.
  await assert.rejects(client.chat.completions.create({ ...long, max_tokens: 2 }),
                       (e) => e.status === 429 && e.code === 'queue_full');
  const before = await metrics(server);
  for (const ac of controllers) ac.abort();
  await Promise.all(pending);
  // The dropped clients' generations (running and queued) are cancelled.
  const deadline = Date.now() + 5000;
  let m = await metrics(server);
  while (m.swiftlet_requests_cancelled_total - before.swiftlet_requests_cancelled_total < 4 && Date.now() < deadline) {
    await sleep(50);
    m = await metrics(server);
  }
  assert.equal(m.swiftlet_requests_cancelled_total - before.swiftlet_requests_cancelled_total, 4);
  assert.equal(m.swiftlet_queue_length, 0);
  await assertHealthy();
});

// A streamed chat over raw HTTP. onEvent(data, req, res) sees each SSE payload.
function rawStream(body, { onResponse, onEvent } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: '127.0.0.1', port: server.port, method: 'POST', path: '/v1/chat/completions',
      headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}` },
    }, (res) => {
      let buf = '';
      const events = [];
      res.setEncoding('utf8');
      if (onResponse) onResponse(req, res);
      res.on('data', (d) => {
        buf += d;
        let cut;
        while ((cut = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          if (!ev.startsWith('data: ')) continue;
          events.push(ev.slice(6));
          if (onEvent) onEvent(ev.slice(6), req, res);
        }
      });
      res.on('end', () => resolve({ status: res.statusCode, events }));
      res.on('error', () => resolve({ status: res.statusCode, events, aborted: true }));
    });
    req.on('error', (e) => (req.destroyed ? resolve({ aborted: true }) : reject(e)));
    req.end(JSON.stringify({ model: MODEL, stream: true, ...body }));
  });
}

const textOf = (events) => events.filter((e) => e !== '[DONE]').map((e) => JSON.parse(e))
  .flatMap((c) => c.choices).map((ch) => ch.delta.content || '').join('');

test('an abrupt disconnect mid-stream stops the generation', async () => {
  const before = await metrics(server);
  let seen = 0;
  await rawStream({ messages: poem, max_tokens: CTX - 40, temperature: 0 }, {
    onEvent: (data, req) => { if (++seen === 6) req.destroy(); },
  });
  assert.equal(seen, 6);
  const deadline = Date.now() + 5000;
  let m = await metrics(server);
  while (m.swiftlet_requests_cancelled_total === before.swiftlet_requests_cancelled_total && Date.now() < deadline) {
    await sleep(20);
    m = await metrics(server);
  }
  assert.equal(m.swiftlet_requests_cancelled_total - before.swiftlet_requests_cancelled_total, 1);
  const generated = m.swiftlet_generated_tokens_total - before.swiftlet_generated_tokens_total;
  assert.ok(generated < CTX - 40, `the generation stopped early (${generated} tokens)`);
  const r = await client.chat.completions.create({ model: MODEL, messages: poem, temperature: 0, max_tokens: 3 });
  assert.equal(r.usage.completion_tokens, 3, 'and the next request is served');
});

test('a client that drops a non-streamed request cancels it too', async () => {
  const before = await metrics(server);
  const ac = new AbortController();
  const req = client.chat.completions.create({ model: MODEL, messages: poem, max_tokens: CTX - 40, temperature: 0 },
                                            { signal: ac.signal });
  await sleep(300);
  ac.abort();
  await assert.rejects(req);
  const deadline = Date.now() + 5000;
  let m = await metrics(server);
  while (m.swiftlet_requests_cancelled_total === before.swiftlet_requests_cancelled_total && Date.now() < deadline) {
    await sleep(20);
    m = await metrics(server);
  }
  assert.equal(m.swiftlet_requests_cancelled_total - before.swiftlet_requests_cancelled_total, 1);
  assert.ok(m.swiftlet_generated_tokens_total - before.swiftlet_generated_tokens_total < CTX - 40);
  await assertHealthy();
});

test('slow clients hold up nobody', async () => {
  // One that never finishes sending its headers ...
  const loris = await connect(server.port);
  loris.write('POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n');
  // ... and one that stops reading its stream for a while.
  let paused;
  const slow = rawStream({ messages: poem, max_tokens: 24, temperature: 0 }, {
    onResponse: (req, res) => { res.pause(); paused = res; },
  });
  const other = await client.chat.completions.create({ model: MODEL, messages: poem, temperature: 0, max_tokens: 24 });
  assert.ok(other.choices[0].message.content.length > 0);
  assert.ok(paused, 'the slow stream was answered');
  paused.resume();
  const s = await slow;
  assert.equal(s.events.at(-1), '[DONE]');
  assert.equal(textOf(s.events), other.choices[0].message.content);
  loris.destroy();
  await assertHealthy();
});

// ------------------------------------------------------------------------------- chat page

test('the chat page streams an answer', async () => {
  const { chromium } = oracles('playwright-core');
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox'] });
  try {
    const page = await browser.newPage({ viewport: { width: 1100, height: 760 } });
    await page.addInitScript((key) => localStorage.setItem('swiftlet_api_key', key), KEY);
    await page.goto(server.base + '/');
    await page.waitForFunction(() => document.getElementById('model').textContent.startsWith('tiny'));
    await page.fill('#temperature', '0');
    await page.fill('#max_tokens', '40');
    // Count the DOM updates of the answer: a streamed answer arrives in many.
    await page.evaluate(() => {
      window.updates = 0;
      new MutationObserver(() => { window.updates++; })
        .observe(document.getElementById('log'), { subtree: true, childList: true, characterData: true });
    });
    const question = 'Hello! Who are you?';
    await page.fill('#input', question);
    await page.click('#send');
    const answer = page.locator('.msg.assistant[data-done="1"]');
    await answer.waitFor({ timeout: 20000 });
    const text = await answer.locator('.content').textContent();
    const updates = await page.evaluate(() => window.updates);
    assert.ok(updates > 5, `the answer streamed in (${updates} DOM updates)`);
    const expected = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: question }], temperature: 0, max_tokens: 40,
    });
    assert.equal(text, expected.choices[0].message.content);
    assert.match(await answer.locator('.meta').textContent(), /tok\/s.*cache hit/);

    // A second turn: the page sends the whole conversation, the server reuses its prefix.
    await page.fill('#input', 'Tell me more.');
    await page.click('#send');
    await page.locator('.msg.assistant[data-done="1"]').nth(1).waitFor({ timeout: 20000 });
    const meta2 = await page.locator('.msg.assistant .meta').nth(1).textContent();
    const reused = Number(/reused (\d+)/.exec(meta2)[1]);
    assert.ok(reused > 0, meta2);
    assert.match(await page.locator('#stats').textContent(), /tok\/s/);

    const dir = process.env.SWIFTLET_ARTIFACTS || os.tmpdir();
    mkdirSync(dir, { recursive: true });
    const shot = path.join(dir, 'chat_page.png');
    await page.screenshot({ path: shot, fullPage: true });
    console.log(`# screenshot: ${shot}`);
  } finally {
    await browser.close();
  }
});
