// swiftlet-server's limits and its behaviour under injected expert-read faults, on servers
// started for them: --max-header-kb (431) and --max-tokens, the warning for a non-loopback
// address without --api-key, and EIO on expert reads (the fault shim, tests/fault/fault_shim.cpp):
// that request gets a 500 naming the layer and expert, the next one is served.
//
//   SWIFTLET_SERVER=... SWIFTLET_REPACK=... SWIFTLET_FAULT_SHIM=build/bin/libswiftlet_fault_shim.so \
//     node --test tests/server/limits_faults.test.mjs      (from the source root; ctest does this)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, rawRequest } from './helpers.mjs';

const chat = (content, extra = {}) => JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content }], temperature: 0, ...extra });

test('request headers over --max-header-kb get 431; --max-tokens caps what one request generates', async () => {
  const server = await startServer({ args: ['--max-header-kb', '4', '--max-tokens', '3'] });
  try {
    const headers = {};
    for (let i = 0; i < 6; ++i) headers[`X-Padding-${i}`] = 'p'.repeat(1000);
    const r = await rawRequest(server, { body: chat('hi', { max_tokens: 2 }), headers });
    assert.equal(r.status, 431);
    assert.equal(JSON.parse(r.body).error.code, 'headers_too_large');
    const ok = await rawRequest(server, { body: chat('Write a long story.', { max_tokens: 50 }), headers: { 'X-Small': 'p'.repeat(1000) } });
    assert.equal(ok.status, 200, ok.body);
    const j = JSON.parse(ok.body);
    assert.ok(j.usage.completion_tokens <= 3, `generated ${j.usage.completion_tokens} tokens`);
    assert.equal(j.choices[0].finish_reason, 'length');
  } finally {
    await server.stop();
  }
});

test('a non-loopback address without --api-key is warned about, with one it is not', async () => {
  const open = await startServer({ host: '0.0.0.0' });
  const openErr = open.stderr();
  await open.stop();
  assert.match(openErr, /WARNING: listening on 0\.0\.0\.0 without an API key/);
  const keyed = await startServer({ host: '0.0.0.0', apiKey: 'sk-x' });
  const keyedErr = keyed.stderr();
  await keyed.stop();
  assert.doesNotMatch(keyedErr, /WARNING/);
});

test('an expert read error fails that request with a 500 naming layer and expert; the next is served', async (t) => {
  const shim = process.env.SWIFTLET_FAULT_SHIM;
  if (!shim) return t.skip('SWIFTLET_FAULT_SHIM is not set (ctest sets it)');
  const dir = mkdtempSync(path.join(os.tmpdir(), 'swiftlet-fault-'));
  const flag = path.join(dir, 'fail-now');
  const server = await startServer({
    // A small cache, so that each request reads experts (the default may hold every one).
    args: ['--io', 'serial', '--cache-mb', '0.05'],
    env: {
      LD_PRELOAD: shim,
      ASAN_OPTIONS: `${process.env.ASAN_OPTIONS ?? ''}:verify_asan_link_order=0`,
      SWIFTLET_FAULT_MODE: 'eio', SWIFTLET_FAULT_MATCH: 'packed_experts/layer_', SWIFTLET_FAULT_FLAG: flag,
    },
  });
  try {
    const first = await rawRequest(server, { body: chat('Tell me about the sea.', { max_tokens: 4 }) });
    assert.equal(first.status, 200, first.body);
    writeFileSync(flag, '');
    const failed = await rawRequest(server, { body: chat('Something else entirely: mountains and rivers.', { max_tokens: 4 }) });
    assert.equal(failed.status, 500, failed.body);
    const err = JSON.parse(failed.body).error;
    assert.match(err.message, /cannot read layer \d\d expert \d+ .*Input\/output error/);
    const streamed = await rawRequest(server, { body: chat('And a third topic: trains at night.', { max_tokens: 4, stream: true }) });
    assert.match(streamed.body, /data: \{"error".*layer \d\d expert \d+/);
    rmSync(flag);
    const next = await rawRequest(server, { body: chat('Tell me about the sea.', { max_tokens: 4 }) });
    assert.equal(next.status, 200, next.body);
    assert.equal(JSON.parse(next.body).choices[0].message.content, JSON.parse(first.body).choices[0].message.content,
                 'the same answer as before the faults');
  } finally {
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
