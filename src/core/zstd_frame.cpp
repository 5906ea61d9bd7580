#include "core/zstd_frame.h"

#include <zstd.h>

#include <cstdint>
#include <memory>

#include "core/error.h"

namespace swiftlet {

bool is_zstd_frame(std::string_view bytes) {
  if (bytes.size() < 4) return false;
  const auto b = [&](size_t i) { return uint32_t(uint8_t(bytes[i])); };
  return (b(0) | b(1) << 8 | b(2) << 16 | b(3) << 24) == ZSTD_MAGICNUMBER;
}

std::string zstd_decompress(std::string_view bytes, std::string_view what, size_t max_bytes) {
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> ctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  SWIFTLET_CHECK(ctx, "ZSTD_createDCtx failed");
  std::string out;
  const unsigned long long declared = ZSTD_getFrameContentSize(bytes.data(), bytes.size());
  if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared != ZSTD_CONTENTSIZE_ERROR && declared <= max_bytes)
    out.reserve(size_t(declared));
  ZSTD_inBuffer in{bytes.data(), bytes.size(), 0};
  std::string chunk(ZSTD_DStreamOutSize(), '\0');
  for (;;) {
    ZSTD_outBuffer o{chunk.data(), chunk.size(), 0};
    const size_t r = ZSTD_decompressStream(ctx.get(), &o, &in);
    if (ZSTD_isError(r))
      fail("{} is damaged (zstd: {}); restore it from the original model or repack", what, ZSTD_getErrorName(r));
    if (out.size() + o.pos > max_bytes)
      fail("{} decompresses to more than {} bytes, more than any file it may hold", what, max_bytes);
    out.append(chunk.data(), o.pos);
    if (in.pos < in.size || o.pos == o.size) continue;  // more input, or more output pending
    if (r != 0) fail("{} is truncated (its zstd frame ends early); restore it or repack", what);
    break;
  }
  return out;
}

std::string zstd_compress(std::string_view bytes, int level) {
  std::string out(ZSTD_compressBound(bytes.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), bytes.data(), bytes.size(), level);
  SWIFTLET_CHECK(!ZSTD_isError(n), "ZSTD_compress: {}", ZSTD_getErrorName(n));
  out.resize(n);
  return out;
}

}  // namespace swiftlet
