// The .qpack container, manifest version 1 (docs/qpack-format.md): a directory with
// manifest.json (written last), config.json, tokenizer files, the resident model.safetensors,
// and packed_experts/{layout.json, layer_NN.bin}. Each layer file holds expertCount blobs of
// expertStride bytes (a multiple of 16 KiB); one blob holds the sections of one routed expert.
//
// Our extension, ignored by version-1 readers: checksums.json with the xxh3-64 of every other
// file and of every expert blob, checked when an expert is read and by `swiftlet verify`.
#pragma once

#include "core/dtype.h"
#include "format/hf_config.h"
#include "core/qmatrix.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace swiftlet {

inline constexpr const char* kQpackMagic = "QPACK";
inline constexpr int kQpackVersion = 1;
inline constexpr uint64_t kQpackStrideAlign = 16384;
inline constexpr const char* kQpackChecksumsFile = "checksums.json";

uint64_t xxh3_64(const void* data, size_t n);
std::string hash_hex(uint64_t h);  // 16 lowercase hex digits

// A JSON file of a container; throws Error naming it when it is not valid JSON.
nlohmann::json read_json_file(const std::string& path);
// Bytes of an expert blob of `payload` bytes: rounded up to kQpackStrideAlign.
inline uint64_t qpack_stride(uint64_t payload) { return (payload + kQpackStrideAlign - 1) / kQpackStrideAlign * kQpackStrideAlign; }

// One tensor of an expert blob: `name` like "gate_proj.weight" / "down_proj.scales"; `shape` is
// the per-expert shape as stored; offset and size are bytes inside the blob.
struct QpackSection {
  std::string name;
  DType dtype = DType::U32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;
  uint64_t size = 0;
  bool operator==(const QpackSection&) const = default;
};

// How one projection of a routed expert is stored: float (bits 16) or MLX affine.
struct ProjectionFormat {
  int bits = 4;                  // 4 or 8: affine; 16: float of `dtype`
  int group_size = 64;           // affine only
  DType dtype = DType::BF16;     // float: the weight dtype; affine: scales and biases dtype
  bool affine() const { return bits != 16; }
  bool operator==(const ProjectionFormat&) const = default;
  std::string describe() const;  // "4-bit g64 (BF16 scales)" / "BF16"
};

// The three projections of an expert, in blob order.
inline constexpr const char* kExpertProjections[3] = {"gate_proj", "up_proj", "down_proj"};
// rows x cols of projection p (gate and up: [moe_intermediate, hidden]; down: the reverse).
std::pair<int64_t, int64_t> expert_projection_shape(int p, const ModelConfig& c);

struct QpackLayout {
  int expert_count = 0;
  int layer_count = 0;
  uint64_t expert_stride = 0;
  std::vector<QpackSection> sections;  // of one expert, in blob order
  std::vector<bool> linear_layers;     // true for Gated DeltaNet layers

  // Sections back to back in the documented order (per projection weight, scales, biases;
  // projections gate, up, down), stride = payload rounded up to 16 KiB.
  static QpackLayout plan(const ModelConfig& c, const ProjectionFormat formats[3]);

  uint64_t payload() const;  // bytes of one expert's sections
  const QpackSection* find(std::string_view name) const;
  // The storage format of projection p (0 gate, 1 up, 2 down), read from its sections.
  ProjectionFormat projection_format(int p, const ModelConfig& c) const;
  // Projection p of any expert: its shape and format, and where its sections sit in a blob
  // (looked up by name once, so that an expert's views cost three additions each).
  struct ProjectionView {
    QMatrix m;  // data, scales and biases null
    uint64_t data = 0, scales = 0, biases = 0;
    QMatrix at(const uint8_t* blob) const;
  };
  ProjectionView projection_view(int p, const ModelConfig& c) const;
  // A view of projection p of the expert whose blob starts at `blob`.
  QMatrix view(int p, const ModelConfig& c, const uint8_t* blob) const { return projection_view(p, c).at(blob); }

  nlohmann::ordered_json to_json() const;
  static QpackLayout parse(const nlohmann::json& j, const std::string& source);
  // Throws Error (naming `source` and the numbers) unless the layout fits the model config:
  // counts, layer kinds, section names / order / shapes / sizes, stride and its alignment.
  void validate(const ModelConfig& c, const std::string& source) const;
};

struct QpackManifest {
  std::string magic = kQpackMagic;
  int version = kQpackVersion;
  std::string model_name;         // the model_type
  std::string source_checkpoint;  // where it came from (a path, ORG/REPO, synthetic:PRESET)
  int quant_bits = 4;             // 16 when not quantised
  int quant_group_size = 64;
  std::map<std::string, uint64_t> files;  // relative path -> bytes (every file but the manifest)

  nlohmann::ordered_json to_json() const;
  // Checks magic and version with messages that say what to do.
  static QpackManifest parse(const nlohmann::json& j, const std::string& source);
};

// checksums.json (our extension). Hashes are xxh3-64; an expert's covers its payload bytes
// [0, layout.payload()) of its blob.
struct QpackChecksums {
  std::string algorithm = "xxh3-64";
  std::map<std::string, uint64_t> files;       // relative path -> hash of the whole file
  std::vector<std::vector<uint64_t>> experts;  // [layer][expert]

  nlohmann::ordered_json to_json() const;
  static QpackChecksums parse(const nlohmann::json& j, const std::string& source);
  // Throws Error (naming `source`, ending with `redo`) unless `experts` is layers x count.
  void require_experts(int layers, int count, const std::string& source, const std::string& redo) const;
};

std::string qpack_layer_file(int layer);  // "packed_experts/layer_07.bin"

// Whether `path` names a container: a directory holding manifest.json or packed_experts/, or
// a path whose name ends in ".qpack".
bool looks_like_qpack(const std::string& path);

// An opened container whose structure has been checked (no hashing): manifest magic/version,
// every listed file present with its listed size, config, layout against config, layer file
// sizes, checksums dimensions. Throws Error naming the file and what to do.
struct QpackContainer {
  std::string dir;
  QpackManifest manifest;
  ModelConfig config;
  QpackLayout layout;
  std::optional<QpackChecksums> checksums;

  static QpackContainer open(const std::string& path);
  std::string path(const std::string& rel) const;
  std::string layer_path(int layer) const { return path(qpack_layer_file(layer)); }
};

// Full check of a container's bytes against checksums.json.
struct QpackVerifyReport {
  bool has_checksums = false;
  uint64_t bytes_hashed = 0;
  int files_checked = 0;
  int64_t experts_checked = 0;
  std::vector<std::string> problems;  // one line each, e.g. "layer 07 expert 311: checksum mismatch"
  bool ok() const { return problems.empty(); }
};
// progress(done_bytes, total_bytes) is called now and then.
QpackVerifyReport verify_qpack(const QpackContainer& qc,
                               const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace swiftlet
