// What swiftlet bench measures besides the model: the memory's read bandwidth and the disk's
// random whole-expert read rate, the bounds its tables compare decode speed with.
#pragma once

#include "format/qpack.h"
#include "experts/expert_reader.h"

#include <cstddef>

namespace swiftlet::cli {

// Read bandwidth of this machine's memory with every compute thread (GB/s), over a buffer far
// larger than the caches, best of a few passes.
double measure_memory_bandwidth(size_t bytes);

// Random expert reads from the container for `seconds`: GB/s with `depth` reads in flight.
double measure_disk(const QpackContainer& qc, IoMode mode, int depth, double seconds);

}  // namespace swiftlet::cli
