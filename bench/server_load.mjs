// Load test for swiftlet-server: N concurrent clients hold multi-turn streamed chats for a
// while; prints requests, tokens, errors, aggregate throughput, TTFT and latency percentiles and
// the server's memory over time. Not part of ctest (it runs for minutes).
//
//   SWIFTLET_SERVER=build/bin/swiftlet-server SWIFTLET_REPACK=build/bin/swiftlet-repack \
//     node bench/server_load.mjs [--clients 8] [--seconds 180] [--parallel 8] [--ctx 4096] [--threads N]
//
// --parallel takes a list ("1,4"): one server run per value, the same load each, then a table
// of the runs side by side (continuous batching against one request at a time).
// Run from the source root. It starts its own server on a tiny synthetic model (loopback only).
import { parseArgs } from 'node:util';
import { startServer, metrics, oracles } from '../tests/server/helpers.mjs';

const { values: opt } = parseArgs({
  options: {
    clients: { type: 'string', default: '8' },
    seconds: { type: 'string', default: '180' },
    parallel: { type: 'string', default: '8' },
    ctx: { type: 'string', default: '4096' },
    threads: { type: 'string', default: '' },
  },
});
const CLIENTS = Number(opt.clients), SECONDS = Number(opt.seconds), CTX = Number(opt.ctx);
const KEY = 'sk-load';
const { OpenAI } = oracles('openai');

const topics = ['the sea', 'mountains', 'a small robot', 'coffee', 'rain in the city', 'an old library', 'trains', 'autumn'];
const pick = (a) => a[Math.floor(Math.random() * a.length)];

async function runLoad(parallel) {
  const args = ['--parallel', String(parallel), '--ctx', String(CTX)];
  if (opt.threads) args.push('--threads', opt.threads);
  const server = await startServer({ apiKey: KEY, args });
  const client = new OpenAI({ baseURL: server.base + '/v1', apiKey: KEY, maxRetries: 0, timeout: 120000 });
  const mib = (b) => (b / (1 << 20)).toFixed(1);

  const stats = { requests: 0, errors: 0, errorMessages: [], promptTokens: 0, cachedTokens: 0, completionTokens: 0,
                  finish: {}, ttft: [], latency: [] };
  const rss = [];
  const start = Date.now();
  const deadline = start + SECONDS * 1000;
  const m0 = await metrics(server);
  rss.push({ t: 0, rss: m0.swiftlet_resident_memory_bytes });

  async function runClient(id) {
    let messages = [];
    while (Date.now() < deadline) {
      if (messages.length === 0 || messages.length > 12) messages = [{ role: 'system', content: `You are client ${id}.` }];
      messages.push({ role: 'user', content: `Tell me about ${pick(topics)}, turn ${messages.length}.` });
      const t0 = Date.now();
      let ttft = 0, text = '', usage = null, finish = null;
      try {
        const stream = await client.chat.completions.create({
          model: 'tiny', messages, stream: true, stream_options: { include_usage: true },
          max_tokens: 16 + Math.floor(Math.random() * 48), temperature: 0.7, seed: Math.floor(Math.random() * 1e9),
        });
        for await (const c of stream) {
          if (c.usage) usage = c.usage;
          for (const ch of c.choices) {
            if (ch.delta.content) { if (!ttft) ttft = Date.now() - t0; text += ch.delta.content; }
            if (ch.finish_reason) finish = ch.finish_reason;
          }
        }
        if (!usage || !finish) throw new Error('stream ended without usage or finish_reason');
        stats.requests++;
        stats.promptTokens += usage.prompt_tokens;
        stats.cachedTokens += usage.prompt_tokens_details.cached_tokens;
        stats.completionTokens += usage.completion_tokens;
        stats.finish[finish] = (stats.finish[finish] || 0) + 1;
        if (ttft) stats.ttft.push(ttft);
        stats.latency.push(Date.now() - t0);
        messages.push({ role: 'assistant', content: text });
      } catch (e) {
        stats.errors++;
        if (stats.errorMessages.length < 5) stats.errorMessages.push(String(e.message || e));
        messages = [];
      }
    }
  }

  const sampler = setInterval(async () => {
    const m = await metrics(server).catch(() => null);
    if (m) rss.push({ t: (Date.now() - start) / 1000, rss: m.swiftlet_resident_memory_bytes });
  }, 5000);
  await Promise.all(Array.from({ length: CLIENTS }, (_, i) => runClient(i)));
  clearInterval(sampler);
  const elapsed = (Date.now() - start) / 1000;
  const m1 = await metrics(server);
  rss.push({ t: elapsed, rss: m1.swiftlet_resident_memory_bytes });
  const exit = await server.stop();

  const afterWarmup = rss.filter((r) => r.t >= 30).map((r) => r.rss);
  const steps = m1.swiftlet_batch_steps_total - m0.swiftlet_batch_steps_total;
  const summary = {
    parallel, clients: CLIENTS, seconds: Number(elapsed.toFixed(1)),
    requests: stats.requests, errors: stats.errors, error_messages: stats.errorMessages, finish_reasons: stats.finish,
    prompt_tokens: stats.promptTokens, cached_prompt_tokens: stats.cachedTokens,
    prefix_cache_hit_rate: Number((stats.cachedTokens / Math.max(1, stats.promptTokens)).toFixed(3)),
    completion_tokens: stats.completionTokens,
    generated_tok_s_overall: Number((stats.completionTokens / elapsed).toFixed(1)),
    server_decode_tok_s_last: m1.swiftlet_decode_tokens_per_second,
    mean_batch_size: steps > 0 ? Number(((m1.swiftlet_batch_rows_total - m0.swiftlet_batch_rows_total) / steps).toFixed(2)) : 0,
    ttft_ms_p50: pct(stats.ttft, 0.5), ttft_ms_p90: pct(stats.ttft, 0.9), ttft_ms_p99: pct(stats.ttft, 0.99),
    latency_ms_p50: pct(stats.latency, 0.5), latency_ms_p95: pct(stats.latency, 0.95),
    server_requests_cancelled: m1.swiftlet_requests_cancelled_total, server_requests_failed: m1.swiftlet_requests_failed_total,
    server_rejected_429: m1.swiftlet_requests_rejected_total,
    rss_mib_start: mib(rss[0].rss), rss_mib_end: mib(rss.at(-1).rss),
    rss_mib_max_after_30s: afterWarmup.length ? mib(Math.max(...afterWarmup)) : null,
    rss_mib_min_after_30s: afterWarmup.length ? mib(Math.min(...afterWarmup)) : null,
    peak_rss_mib: mib(m1.swiftlet_peak_resident_memory_bytes),
    rss_samples_mib: rss.map((r) => `${r.t.toFixed(0)}s:${mib(r.rss)}`).join(' '),
    server_exit: exit,
  };
  console.log(JSON.stringify(summary, null, 2));
  return { summary, ok: stats.errors === 0 && exit && exit.code === 0 };
}

const pct = (a, p) => { const s = [...a].sort((x, y) => x - y); return s.length ? s[Math.min(s.length - 1, Math.floor(p * s.length))] : 0; };
const runs = [];
for (const p of opt.parallel.split(',').map(Number)) runs.push(await runLoad(p));
if (runs.length > 1) {
  const rows = [['--parallel', 'requests', 'tokens', 'agg tok/s', 'mean batch', 'TTFT p50', 'p90', 'p99 (ms)', 'latency p50 (ms)', 'errors']];
  for (const { summary: r } of runs)
    rows.push([r.parallel, r.requests, r.completion_tokens, r.generated_tok_s_overall, r.mean_batch_size,
               r.ttft_ms_p50, r.ttft_ms_p90, r.ttft_ms_p99, r.latency_ms_p50, r.errors].map(String));
  const w = rows[0].map((_, c) => Math.max(...rows.map((r) => r[c].length)));
  for (const r of rows) console.log(r.map((v, c) => v.padStart(w[c])).join('  '));
  const base = runs[0].summary.generated_tok_s_overall;
  for (const { summary: r } of runs.slice(1))
    console.log(`--parallel ${r.parallel}: ${(r.generated_tok_s_overall / Math.max(1e-9, base)).toFixed(2)}x the aggregate tok/s of --parallel ${runs[0].summary.parallel}`);
}
process.exit(runs.every((r) => r.ok) ? 0 : 1);
