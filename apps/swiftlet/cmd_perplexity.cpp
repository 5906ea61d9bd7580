// swiftlet perplexity MODEL --file TEXT [--ctx N] [--chunks K] [--json] [--save-logits F]
//   [--compare-logits F] [--trace-experts F] [model flags]
// llama-perplexity's measure (runtime/perplexity.h, docs/perplexity.md): the whole file encoded
// with special tokens parsed, cut into full windows of ctx tokens, each run from a fresh state as
// one prompt; the second half of each window scored. Progress on stderr, the result on stdout.
#include "cli_util.h"
#include "commands.h"

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/mapped_file.h"
#include "runtime/perplexity.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

namespace swiftlet::cli {

namespace {
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct PerplexityOptions {
  ModelFlags model;
  TraceFlag trace;
  std::string file, save_logits, compare_logits;
  int ctx = 512;
  int chunks = 0;
  int prefill_chunk = 0;  // tokens per forward call (0: the session's default, 1024)
  bool json = false;
};

// What one scored row contributes.
struct RowResult {
  double nll = 0;
  bool top1_correct = false;
  double kl = 0;           // --compare-logits
  bool top1_same = false;  // --compare-logits
  double base_nll = 0;     // --compare-logits: the saved run's NLL of the same token
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, size_t(std::ceil(p * double(v.size() - 1))));
  std::nth_element(v.begin(), v.begin() + ptrdiff_t(i), v.end());
  return v[i];
}

void run_perplexity(const PerplexityOptions& o) {
  if (o.ctx < 4) fail("--ctx must be at least 4 tokens (half of each window is context), got {}", o.ctx);
  if (o.chunks < 0) fail("--chunks must be >= 0 (0: every full window), got {}", o.chunks);
  if (o.prefill_chunk < 0) fail("--prefill-chunk must be >= 1 (0: the default), got {}", o.prefill_chunk);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(o.file, ec)) fail("--file: '{}' is not a text file", o.file);
  const std::string text = read_text_file(o.file);
  Engine engine(o.model.engine_options());
  const Tokenizer& tok = engine.require_tokenizer();
  const std::vector<int32_t> tokens = tok.encode(text, /*parse_special=*/true);
  const int64_t ctx = o.ctx, V = engine.config().vocab_size;
  int64_t windows = int64_t(tokens.size()) / ctx;
  if (windows == 0)
    fail("'{}' has {} tokens, fewer than one window of --ctx {}: give a longer text or a smaller --ctx", o.file,
         tokens.size(), ctx);
  if (o.chunks > 0) windows = std::min<int64_t>(windows, o.chunks);
  const int64_t first = first_scored(ctx), per_window = scored_per_window(ctx);
  const std::span<const int32_t> evaluated = std::span(tokens).first(size_t(windows * ctx));
  LogProbFileInfo info;
  info.vocab = uint32_t(V);
  info.ctx = uint32_t(ctx);
  info.windows = uint32_t(windows);
  info.scored = uint64_t(windows * per_window);
  info.tokens_hash = tokens_hash(evaluated);

  std::optional<LogProbReader> base;
  if (!o.compare_logits.empty()) {
    base.emplace(o.compare_logits);
    const LogProbFileInfo& b = base->info();
    if (b.vocab != info.vocab || b.ctx != info.ctx || b.windows != info.windows || b.tokens_hash != info.tokens_hash)
      fail("--compare-logits: '{}' was saved from {} windows of --ctx {} over other tokens or another vocabulary "
           "({} entries); this run has {} windows of --ctx {} and {} entries: use the same text, --ctx and --chunks",
           o.compare_logits, b.windows, b.ctx, b.vocab, info.windows, info.ctx, info.vocab);
  }
  std::optional<LogProbWriter> save;
  if (!o.save_logits.empty()) {
    save.emplace(o.save_logits, info);
    std::fprintf(stderr, "perplexity: saving %.2f GB of log-probabilities to %s\n",
                 double(log_prob_file_bytes(info)) / 1e9, o.save_logits.c_str());
  }
  std::unique_ptr<RoutingTraceWriter> trace = o.trace.open(engine, o.model, /*decode=*/false);
  SessionOptions so;
  so.routing_observer = trace.get();
  if (o.prefill_chunk > 0) so.prefill_chunk = o.prefill_chunk;
  auto session = engine.new_session(so);

  std::fprintf(stderr, "perplexity: %zu tokens, %lld windows of %lld, %lld scored per window\n", tokens.size(),
               (long long)windows, (long long)ctx, (long long)per_window);
  const ExpertSource* experts = engine.model().experts;
  const ExpertStats experts_before = experts ? experts->expert_stats() : ExpertStats{};
  MeanStat nll, base_nll, kl, top1, same;
  std::vector<double> kls;
  std::vector<RowResult> rows(static_cast<size_t>(per_window));
  std::vector<QuantizedLogProbs> saved(static_cast<size_t>(per_window));
  const auto t0 = Clock::now();
  for (int64_t w = 0; w < windows; ++w) {
    const std::span<const int32_t> win = evaluated.subspan(size_t(w * ctx), size_t(ctx));
    const std::vector<float>& logits = session->score(win, first);  // rows first .. ctx - 1
    if (base)
      for (QuantizedLogProbs& s : saved) base->read(s);
    ThreadPool::global().parallel_for(per_window, [&](int64_t i) {
      const int64_t j = first + i;
      const std::span<const float> row(logits.data() + i * V, size_t(V));
      const int32_t target = win[size_t(j + 1)];
      RowResult& r = rows[size_t(i)];
      r.nll = token_nll(row, target);
      r.top1_correct = std::max_element(row.begin(), row.end()) - row.begin() == target;
      if (save) quantize_log_probs(row, saved[size_t(i)]);
      if (base) {
        thread_local std::vector<double> log_p;
        dequantize_log_probs(saved[size_t(i)], log_p);
        r.kl = kl_divergence(log_p, row);
        r.top1_same = int64_t(saved[size_t(i)].argmax) == std::max_element(row.begin(), row.end()) - row.begin();
        r.base_nll = -log_p[size_t(target)];
      }
    });
    for (const RowResult& r : rows) {
      nll.add(r.nll);
      top1.add(r.top1_correct ? 1 : 0);
      if (base) {
        kl.add(r.kl);
        kls.push_back(r.kl);
        same.add(r.top1_same ? 1 : 0);
        base_nll.add(r.base_nll);
      }
    }
    if (save)
      for (const QuantizedLogProbs& s : saved) save->write(s);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    std::fprintf(stderr, "[%lld/%lld] ppl %.4f%s | %.1f s, %.1f tok/s\n", (long long)(w + 1), (long long)windows,
                 std::exp(nll.mean()), base ? fmt::format(" | KL {:.6f}", kl.mean()).c_str() : "", secs,
                 double((w + 1) * ctx) / secs);
  }
  if (save) save->finish();
  TraceFlag::finish(trace.get(), o.trace.path);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();

  ExpertStats ex = experts ? experts->expert_stats() : ExpertStats{};
  ex.hits -= experts_before.hits;
  ex.misses -= experts_before.misses;
  ex.skipped -= experts_before.skipped;
  ex.low_bit -= experts_before.low_bit;
  ex.bytes_read -= experts_before.bytes_read;
  const MissPolicy& on_miss = engine.on_miss();
  const std::string experts_text =
      fmt::format("experts: {} | {} hits, {} misses ({} low-bit), {} skipped | read {:.3f} GB\n", on_miss.label(),
                  ex.hits, ex.misses, ex.low_bit, ex.skipped, double(ex.bytes_read) / 1e9);
  const double ppl = std::exp(nll.mean()), ppl_err = ppl * nll.stderr_of_mean();
  json j = {{"model", o.model.model},
            {"file", o.file},
            {"n_tokens", tokens.size()},
            {"n_windows", windows},
            {"n_scored", nll.n},
            {"ctx", ctx},
            {"nll_mean", nll.mean()},
            {"nll_stderr", nll.stderr_of_mean()},
            {"ppl", ppl},
            {"ppl_stderr", ppl_err},
            {"top1_accuracy", top1.mean()},
            {"seconds", secs},
            {"tok_s", double(windows * ctx) / secs},
            {"on_miss", on_miss.name()},
            {"lossy", on_miss.lossy()},
            {"experts",
             {{"hits", ex.hits}, {"misses", ex.misses}, {"skipped", ex.skipped}, {"low_bit", ex.low_bit}, {"bytes_read", ex.bytes_read}}}};
  std::string kl_text;
  if (base) {
    const double base_ppl = std::exp(base_nll.mean());
    j["compare"] = {{"file", o.compare_logits},
                    {"base_ppl", base_ppl},
                    {"ln_ppl_ratio", nll.mean() - base_nll.mean()},
                    {"kl_mean", kl.mean()},
                    {"kl_stderr", kl.stderr_of_mean()},
                    {"kl_median", percentile(kls, 0.5)},
                    {"kl_p99", percentile(kls, 0.99)},
                    {"kl_max", percentile(kls, 1.0)},
                    {"top1_agreement", same.mean()},
                    {"top1_agreement_stderr", same.stderr_of_mean()}};
    kl_text = fmt::format(
        "against {}: base PPL {:.4f}, ln(PPL/base PPL) {:+.6f}\n"
        "KL divergence: mean {:.6f} +/- {:.6f}, median {:.6f}, p99 {:.6f}, max {:.6f}\n"
        "same top token: {:.3f}% +/- {:.3f}%\n",
        o.compare_logits, base_ppl, nll.mean() - base_nll.mean(), kl.mean(), kl.stderr_of_mean(),
        percentile(kls, 0.5), percentile(kls, 0.99), percentile(kls, 1.0), 100 * same.mean(),
        100 * same.stderr_of_mean());
  }
  if (o.json) {
    std::printf("%s\n", j.dump(1).c_str());
    return;
  }
  std::printf("%zu tokens, %lld windows of %lld, %llu scored tokens (%.1f s, %.1f tok/s)\n"
              "PPL = %.4f +/- %.4f (mean NLL %.6f +/- %.6f), top-1 accuracy %.2f%%\n%s%s",
              tokens.size(), (long long)windows, (long long)ctx, (unsigned long long)nll.n, secs,
              double(windows * ctx) / secs, ppl, ppl_err, nll.mean(), nll.stderr_of_mean(), 100 * top1.mean(),
              experts_text.c_str(), kl_text.c_str());
}
}  // namespace

void add_perplexity_command(CLI::App& app) {
  auto o = std::make_shared<PerplexityOptions>();
  auto* cmd = app.add_subcommand("perplexity", "perplexity of a text in windows (as llama-perplexity), KL against a saved run");
  o->model.add(cmd);
  cmd->add_option("--file,-f", o->file, "the text (special-token strings such as <|im_start|> are parsed)")->required();
  cmd->add_option("--ctx,-c", o->ctx, "window length in tokens; the second half of each is scored");
  cmd->add_option("--chunks", o->chunks, "evaluate only the first K windows (0: all full windows)");
  cmd->add_flag("--json", o->json, "print the result as one JSON object");
  cmd->add_option("--prefill-chunk", o->prefill_chunk,
                  "tokens per forward call (default 1024); 1 runs a window token by token as decode does, so the "
                  "expert cache and --on-miss act as they do in decode (exact results do not change)");
  cmd->add_option("--save-logits", o->save_logits,
                  "save every scored token's log-probabilities (2 bytes per vocabulary entry) for --compare-logits");
  cmd->add_option("--compare-logits", o->compare_logits,
                  "report KL divergence and top-1 agreement against log-probabilities saved by --save-logits");
  o->trace.add(cmd);
  cmd->callback([o] { run_perplexity(*o); });
}

}  // namespace swiftlet::cli
