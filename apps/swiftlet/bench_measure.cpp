#include "bench_measure.h"

#include "core/error.h"
#include "core/thread_pool.h"
#include "experts/expert_reader.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

namespace swiftlet::cli {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

double measure_memory_bandwidth(size_t bytes) {
  const size_t n = bytes / sizeof(uint64_t);
  std::vector<uint64_t> buf(n, 1);
  ThreadPool& pool = ThreadPool::global();
  const int64_t tasks = int64_t(pool.size()) * 16;
  std::vector<uint64_t> sums(static_cast<size_t>(tasks));
  double best = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const auto t0 = Clock::now();
    pool.parallel_for(tasks, [&](int64_t t) {
      const size_t a = n * size_t(t) / size_t(tasks), b = n * size_t(t + 1) / size_t(tasks);
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (size_t i = a; i + 4 <= b; i += 4) {
        s0 += buf[i];
        s1 += buf[i + 1];
        s2 += buf[i + 2];
        s3 += buf[i + 3];
      }
      sums[size_t(t)] = s0 + s1 + s2 + s3;
    });
    best = std::max(best, double(n * sizeof(uint64_t)) / since(t0) / 1e9);
  }
  volatile uint64_t keep = 0;  // the sums are used, so the loads are not optimised away
  for (uint64_t v : sums) keep = keep + v;
  return best;
}

double measure_disk(const QpackContainer& qc, IoMode mode, int depth, double seconds) {
  std::unique_ptr<ExpertReader> r = make_expert_reader(qc, mode, depth);
  const size_t stride = size_t(qc.layout.expert_stride);
  std::vector<uint8_t*> bufs;
  for (int i = 0; i < depth; ++i) {
    bufs.push_back(static_cast<uint8_t*>(std::aligned_alloc(4096, stride)));
    r->register_buffer(i, bufs.back(), stride);
  }
  std::mt19937 rng(99);
  auto submit = [&](int slot) {
    r->submit(int(rng() % uint32_t(qc.layout.layer_count)), int(rng() % uint32_t(qc.layout.expert_count)),
              bufs[size_t(slot)], stride, uint64_t(slot), slot);
  };
  std::vector<ReadDone> done;
  uint64_t bytes = 0;
  const auto t0 = Clock::now();
  for (int i = 0; i < depth; ++i) submit(i);
  double t = 0;
  while ((t = since(t0)) < seconds) {
    done.clear();
    r->reap(true, done);
    for (const ReadDone& d : done) {
      if (!d.error.empty()) fail("{}", d.error);
      bytes += stride;
      submit(int(d.tag));
    }
  }
  while (r->outstanding() > 0) {
    done.clear();
    r->reap(true, done);
  }
  r.reset();
  for (uint8_t* b : bufs) std::free(b);
  return double(bytes) / t / 1e9;
}

}  // namespace swiftlet::cli
