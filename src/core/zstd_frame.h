// Zstandard frames: the container may hold its tokenizer as tokenizer.json.zst (a 5 MB JSON
// file becomes ~1.5 MB; docs/qpack-format-extensions.md).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace swiftlet {

// True when the bytes start with a Zstandard frame's magic number.
bool is_zstd_frame(std::string_view bytes);

// The decompressed content of one or more concatenated frames. Throws Error (naming `what`) on a
// damaged or truncated frame, or when the result would exceed `max_bytes`.
std::string zstd_decompress(std::string_view bytes, std::string_view what, size_t max_bytes = size_t(1) << 30);

// One frame at the given level (1-19), with its content size recorded.
std::string zstd_compress(std::string_view bytes, int level = 19);

}  // namespace swiftlet
