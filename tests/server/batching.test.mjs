// Continuous batching through the official openai client: eight streams at once against
// --parallel 4 (four decode together, four wait for a slot and join as others leave), each
// stream's text equal to its greedy text obtained another way: the chat streams from the same
// server answering them one at a time first, the completion streams from `swiftlet generate`
// (Session::generate, no batch at all). A stream dropped mid-answer leaves the others' text
// unchanged, and /metrics shows the requests decoded together.
//
// Environment: SWIFTLET_SERVER, SWIFTLET_REPACK, SWIFTLET_CLI (ctest sets them).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { startServer, metrics, oracles, sleep } from './helpers.mjs';

const { OpenAI } = oracles('openai');
const KEY = 'sk-batching';
const MODEL = 'tiny';
const MAX = 24;
let server, client;

before(async () => {
  // A small prefill chunk, so the long prompt below takes many steps to join.
  server = await startServer({ apiKey: KEY, args: ['--parallel', '4', '--max-queue', '16', '--prefill-chunk', '32'] });
  client = new OpenAI({ baseURL: server.base + '/v1', apiKey: KEY, maxRetries: 0, timeout: 120000 });
});

after(async () => {
  const exit = await server?.stop();
  assert.deepEqual(exit, { code: 0, signal: null });
});

const words = ['trains', 'rain', 'coffee', 'a small robot', 'mountains', 'the sea', 'libraries', 'autumn'];
// Chat requests of different lengths, one of them long (hundreds of tokens).
const chats = words.slice(0, 4).map((w, i) => ({
  model: MODEL, max_tokens: MAX, temperature: 0,
  messages: [{ role: 'system', content: `You are assistant ${i}.` },
             { role: 'user', content: `Tell me about ${w}. `.repeat(i === 3 ? 60 : 1 + 3 * i) }],
}));
// Raw completion prompts.
const completions = words.slice(4).map((w, i) => ({
  model: MODEL, max_tokens: MAX, temperature: 0, prompt: `Story ${i} about ${w}:` + ' and then'.repeat(2 * i),
}));

async function streamChat(body, signal) {
  const stream = await client.chat.completions.create({ ...body, stream: true }, signal ? { signal } : undefined);
  let text = '', finish = null;
  for await (const c of stream) {
    for (const ch of c.choices) {
      if (ch.delta.content) text += ch.delta.content;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { text, finish };
}

async function streamCompletion(body) {
  const stream = await client.completions.create({ ...body, stream: true });
  let text = '', finish = null;
  for await (const c of stream) {
    for (const ch of c.choices) {
      text += ch.text ?? '';
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { text, finish };
}

// `swiftlet generate` on the server's model file: the same greedy tokens without any batching.
function generated(prompt) {
  const cli = process.env.SWIFTLET_CLI;
  if (!cli) throw new Error('SWIFTLET_CLI is not set: run this test through ctest, or set it to the built swiftlet');
  return execFileSync(cli, ['generate', path.join(server.dir, 'tiny.qpack'), '--greedy', '-n', String(MAX), '-q', '-p', prompt],
                      { encoding: 'utf8' }).replace(/\n$/, '');  // the CLI ends its text with a newline
}

test('eight concurrent streams against --parallel 4 each get their greedy text', async () => {
  // Expected texts: the completions from the CLI (first: the server drops connections idle for
  // 5 s, which the client's pool would otherwise reuse), the chats one at a time from this server.
  const wantCompletion = completions.map((c) => generated(c.prompt));
  const wantChat = [];
  for (const c of chats) wantChat.push((await streamChat(c)).text);
  for (const t of [...wantChat, ...wantCompletion]) assert.ok(t.length > 0);

  const before = await metrics(server);
  // A ninth stream is dropped after its first piece: the others must not notice.
  const ac = new AbortController();
  const dropped = (async () => {
    const stream = await client.chat.completions.create(
      { ...chats[1], messages: [{ role: 'user', content: 'Say many things.' }], max_tokens: 200, stream: true },
      { signal: ac.signal });
    for await (const c of stream) if (c.choices[0]?.delta?.content) ac.abort();
  })().catch((e) => e);
  const got = await Promise.all([...chats.map((c) => streamChat(c)), ...completions.map((c) => streamCompletion(c))]);
  await dropped;
  for (let i = 0; i < chats.length; ++i) assert.equal(got[i].text, wantChat[i], `chat ${i}`);
  for (let i = 0; i < completions.length; ++i) assert.equal(got[chats.length + i].text, wantCompletion[i], `completion ${i}`);

  const m = await metrics(server);
  const steps = m.swiftlet_batch_steps_total - before.swiftlet_batch_steps_total;
  const rows = m.swiftlet_batch_rows_total - before.swiftlet_batch_rows_total;
  assert.ok(rows > 1.5 * steps, `the streams were not decoded together: ${rows} rows in ${steps} steps`);
  let slotsUsed = 0;
  for (let s = 0; s < 4; ++s) if (m[`swiftlet_slot_generated_tokens_total{slot="${s}"}`] > 0) ++slotsUsed;
  assert.equal(slotsUsed, 4);
  // The dropped stream is cancelled; nothing is left running.
  const deadline = Date.now() + 5000;
  let now = m;
  while (now.swiftlet_requests_running > 0 && Date.now() < deadline) { await sleep(20); now = await metrics(server); }
  assert.equal(now.swiftlet_requests_running, 0);
  assert.ok(now.swiftlet_requests_cancelled_total - before.swiftlet_requests_cancelled_total >= 1);
});
