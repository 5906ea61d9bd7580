// xxh3-64 compiled for AVX2 (this file only: -mavx2), chosen at run time by xxh3_64() when the
// CPU has AVX2. The system libxxhash is built for SSE2; AVX2 about doubles the speed of checking
// an expert as it is read. XXH3 gives the same value whatever vector width computes it.
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace swiftlet {

uint64_t xxh3_64_avx2(const void* data, size_t n) { return XXH3_64bits(data, n); }

}  // namespace swiftlet
