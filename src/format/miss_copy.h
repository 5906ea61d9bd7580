// Low-bit miss copies (our extension of the .qpack container, docs/qpack.md section 9): a second,
// smaller copy of every routed expert at 2 or 3 bits, read instead of the full expert when a miss
// may be served lossily (--on-miss low-bit). Version-1 readers ignore it.
//
//   miss_copies/layout.json      {"format": "swiftlet-miss-copies", "bits": B, "expertStride": S,
//                                 "payloadOffset": P, "sections": [...]} for ONE copy blob
//   miss_copies/layer_NN.bin     expertCount x S bytes, copy e of layer l at e * S
//   miss_copies/checksums.json   xxh3-64 of every copy's payload [P, S)
//
// A copy has the full expert's sections (weight, scales, biases per projection; gate, up, down),
// each projection at B bits with the full projection's group size and scale dtype, so that it
// expands into the full expert's layout exactly: a B-bit code q with scale s and bias b is the
// 4- or 8-bit code q with the same s and b. The payload sits at the END of its stride (the
// padding first): read into the tail of a full-size slot, it expands forward in place, each
// section's output landing behind input already consumed.
#pragma once

#include "format/hf_config.h"
#include "format/qpack.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace swiftlet {

inline constexpr const char* kMissCopyDir = "miss_copies";
inline constexpr const char* kMissCopyLayoutFile = "miss_copies/layout.json";
// The checksums of the copies, in QpackChecksums' format (its `experts` cover each payload).
inline constexpr const char* kMissCopyChecksums = "miss_copies/checksums.json";

struct MissCopyLayout {
  int bits = 2;                        // 2 or 3
  uint64_t stride = 0;                 // bytes per copy blob, a multiple of 16 KiB
  uint64_t payload_offset = 0;         // where the sections start (stride - payload)
  std::vector<QpackSection> sections;  // in the full layout's order, offsets inside the blob

  uint64_t payload() const { return stride - payload_offset; }
  bool operator==(const MissCopyLayout&) const = default;

  // The copy of `full` at `bits`; throws Error when the full experts cannot have one (a float
  // projection, a width whose codes do not fill 32-bit words, bits not below the full bits).
  static MissCopyLayout plan(const QpackLayout& full, const ModelConfig& c, int bits);
  nlohmann::ordered_json to_json() const;
  static MissCopyLayout parse(const nlohmann::json& j, const std::string& source);
};

std::string miss_copy_layer_file(int layer);  // "miss_copies/layer_07.bin"

struct MissCopies {
  MissCopyLayout layout;
  std::vector<std::vector<uint64_t>> sums;  // [layer][expert]; empty without checksums.json

  // The container's copies when its manifest lists miss_copies/layout.json (nullopt otherwise):
  // the layout checked against the one the full layout implies, each layer file's size, the
  // checksums' dimensions. Throws Error naming the file and what to do.
  static std::optional<MissCopies> open(const QpackContainer& qc);
};

// Writes the copy of one full expert blob: each projection dequantised and fitted again at
// copy.bits (per group, the scale and bias of least squared error over a few starting ranges).
// copy_blob has copy.stride bytes (the padding is zeroed).
void make_miss_copy(const QpackLayout& full, const MissCopyLayout& copy, const ModelConfig& c, const uint8_t* full_blob,
                    uint8_t* copy_blob);

// blob holds full.expert_stride bytes whose last copy.stride bytes are a copy blob (as read);
// rewrites it in place as the full expert's layout, each code widened to the full bits.
void expand_miss_copy(const QpackLayout& full, const MissCopyLayout& copy, const ModelConfig& c, uint8_t* blob);

// Code widening, one packed row (LSB-first bit streams): n codes of `from` bits (2 or 3) into
// n codes of `to` bits (4 or 8). n is a multiple of 32. `dst` and `src` do not overlap.
// The scalar reference, the form chosen at run time, and the AVX2 form (x86-64; tests compare).
void widen_codes_reference(const uint8_t* src, int from, uint8_t* dst, int to, size_t n);
void widen_codes(const uint8_t* src, int from, uint8_t* dst, int to, size_t n);
bool widen_codes_avx2(const uint8_t* src, int from, uint8_t* dst, int to, size_t n);  // false: not here

}  // namespace swiftlet
