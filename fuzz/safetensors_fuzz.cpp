// safetensors header and tensor table: any file either opens with every tensor's bytes inside
// the file, or throws Error.
#include "core/error.h"
#include "format/safetensors.h"
#include "fuzz_util.h"

#include <numeric>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  swiftlet::fuzz::MemFile f(data, size);
  try {
    const swiftlet::TensorSet ts = swiftlet::TensorSet::open_files({f.path()});
    volatile uint8_t sink = 0;
    for (const std::string& name : ts.names()) {
      const swiftlet::TensorView& t = ts.get(name);
      // Every byte the table promises must be readable (ASan checks the mapping's bounds).
      if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
      (void)t.shape_str();
    }
  } catch (const swiftlet::Error&) {
  }
  return 0;
}
