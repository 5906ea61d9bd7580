// GGUF header, metadata and tensor table: any file either opens with every tensor's bytes inside
// the file, or throws Error; a tensor of a readable type dequantises.
#include "core/error.h"
#include "format/gguf.h"
#include "format/gguf_quant.h"
#include "fuzz_util.h"

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  swiftlet::fuzz::MemFile f(data, size);
  try {
    const swiftlet::GgufFile g(f.path());
    volatile uint8_t sink = 0;
    for (const swiftlet::GgufTensor& t : g.tensors()) {
      // Every byte the table promises must be readable (ASan checks the mapping's bounds).
      if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
      (void)t.shape_str();
      // Readable types dequantise: every row is whole blocks (the reader checked it).
      if (swiftlet::gguf_type_readable(t.type) && t.numel() <= (1 << 20)) {
        std::vector<float> out(size_t(t.numel()));
        swiftlet::gguf_dequantize(t.type, t.data, t.nbytes, t.numel(), out.data());
      }
    }
    for (const auto& [key, v] : g.metadata()) (void)v.array_size();
  } catch (const swiftlet::Error&) {
  }
  return 0;
}
