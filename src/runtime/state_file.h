// A conversation's whole state in one file (docs/state-cache.md): the tokens it consumed, every
// attention layer's K/V up to there, every DeltaNet layer's conv and recurrent state, the logits
// after the last token (when kept) and a note of the caller's (a chat's messages). Session::save
// and the prefix state cache (state_cache.h) write it; reading checks everything before a byte
// is used: magic, version, model identity, sizes against the model's shape, and the xxh3 of the
// header and of the payload.
#pragma once

#include "model/forward_pass.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace swiftlet {

inline constexpr char kStateFileMagic[8] = {'S', 'W', 'S', 'T', 'A', 'T', 'E', '\0'};
inline constexpr uint32_t kStateFileVersion = 1;

// The fixed header at offset 0, little-endian. The payload follows it:
// tokens (int32 x tokens), per layer in order (attention: k then v, fp32 x tokens x kv_dim;
// DeltaNet: conv then ssm, fp32 at the shapes of SessionState::create), logits (fp32 x
// logits_count), note (note_bytes bytes).
struct StateFileHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;  // sizeof(StateFileHeader)
  uint64_t model_id;      // model_identity()
  uint64_t key;           // the prefix cache's key of these tokens (0 for Session::save)
  int64_t tokens;
  uint64_t logits_count;  // 0 or the vocabulary size
  uint64_t note_bytes;
  uint64_t payload_bytes;
  uint64_t payload_xxh3;
  uint64_t header_xxh3;   // of every byte above this field
};
static_assert(sizeof(StateFileHeader) == 80);

// What a file holds.
struct SavedState {
  SessionState state;          // pos == tokens.size(); KV of pos positions (fits(config))
  std::vector<float> logits;   // after the last token, or empty
  std::string note;
  size_t bytes() const { return state.bytes() + logits.size() * 4 + note.size(); }
};

// A model's identity for saved states: its configuration's shape and the first bytes of every
// resident tensor (cheap; two containers of one shape with other weights differ here).
uint64_t model_identity(const Model& model);

// Payload bytes of a state of `tokens` tokens of this model.
uint64_t state_payload_bytes(const ModelConfig& cfg, int64_t tokens, uint64_t logits_count, uint64_t note_bytes);

// Writes `s` to `path` atomically: a temporary name unique to this process and call in the same
// directory, fsync, rename over `path`. A reader sees the old file, the new one, or none; never
// a part. Throws Error (disk full, no permission) after removing the temporary file.
void write_state_file(const std::string& path, uint64_t model_id, uint64_t key, const SavedState& s);

// Reads and checks a file written for `model_id` (and, when `key` is set, that key). Returns
// nothing and says why in `why` for a file that is missing, truncated, corrupt, of another
// format version or of another model.
std::optional<SavedState> read_state_file(const std::string& path, const ModelConfig& cfg, uint64_t model_id,
                                          std::optional<uint64_t> key, std::string* why);

// Only the header, checked (magic, version, header checksum, sizes against the file's length);
// the payload is not read.
std::optional<StateFileHeader> read_state_header(const std::string& path, std::string* why);

}  // namespace swiftlet
