#include "runtime/state_file.h"

#include "core/error.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

namespace swiftlet {

namespace {

// ------------------------------------------------------------------------ model identity

class Hasher {
 public:
  Hasher() : st_(XXH3_createState()) { XXH3_64bits_reset(st_); }
  ~Hasher() { XXH3_freeState(st_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void add(const void* p, size_t n) {
    if (n) XXH3_64bits_update(st_, p, n);
  }
  template <class T>
  void value(const T& v) {
    add(&v, sizeof v);
  }
  uint64_t digest() const { return XXH3_64bits_digest(st_); }

 private:
  XXH3_state_t* st_;
};

// The first bytes of a tensor: enough to tell two models' weights apart without reading them.
constexpr size_t kSampleBytes = 4096;

void sample(Hasher& h, const QMatrix& m) {
  h.value(m.rows);
  h.value(m.cols);
  h.value(int(m.format));
  h.value(m.bits);
  if (m.empty()) return;
  h.add(m.data, std::min(kSampleBytes, m.row_bytes() * size_t(m.rows)));
  if (m.scales) h.add(m.scales, std::min(kSampleBytes, m.scale_row_bytes() * size_t(m.rows)));
}

void sample(Hasher& h, const std::vector<float>& v) {
  h.value(v.size());
  h.add(v.data(), std::min(kSampleBytes, v.size() * 4));
}

}  // namespace

uint64_t model_identity(const Model& model) {
  const ModelConfig& c = model.config;
  Hasher h;
  h.add(c.model_type.data(), c.model_type.size());
  for (int64_t v : {int64_t(c.family), c.hidden_size, int64_t(c.num_layers), c.vocab_size, int64_t(c.num_heads),
                    int64_t(c.num_kv_heads), int64_t(c.head_dim), int64_t(c.linear_num_key_heads),
                    int64_t(c.linear_num_value_heads), int64_t(c.linear_key_head_dim), int64_t(c.linear_value_head_dim),
                    int64_t(c.linear_conv_kernel_dim), int64_t(c.num_experts), int64_t(c.num_experts_per_tok),
                    c.moe_intermediate_size, c.shared_expert_intermediate_size})
    h.value(v);
  for (bool linear : c.linear_layers) h.value(linear);
  h.value(c.rms_norm_eps);
  h.value(c.rope_theta);
  const ModelWeights& w = model.weights;
  sample(h, w.embed_tokens);
  sample(h, w.lm_head);
  sample(h, w.norm);
  for (const LayerWeights& l : w.layers) {
    sample(h, l.input_layernorm);
    sample(h, l.post_attention_layernorm);
    for (const QMatrix* m :
         {&l.attn.q_proj, &l.attn.o_proj, &l.gdn.in_proj_qkv, &l.gdn.out_proj, &l.moe.router, &l.moe.shared_down_proj})
      sample(h, *m);
    sample(h, l.gdn.A_log);
    sample(h, l.gdn.conv1d);
  }
  return h.digest();
}

uint64_t state_payload_bytes(const ModelConfig& c, int64_t tokens, uint64_t logits_count, uint64_t note_bytes) {
  uint64_t n = uint64_t(tokens) * 4;
  for (int i = 0; i < c.num_layers; ++i) {
    if (c.is_linear_layer(i))
      n += uint64_t((c.linear_conv_kernel_dim - 1) * c.conv_dim()) * 4 +
           uint64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim * 4;
    else
      n += uint64_t(tokens) * uint64_t(c.kv_dim()) * 4 * 2;
  }
  return n + logits_count * 4 + note_bytes;
}

namespace {

// The payload's pieces in file order, as (pointer, bytes) of the state's own memory.
void for_each_piece(SavedState& s, const std::function<void(void*, size_t)>& f) {
  f(s.state.tokens.data(), s.state.tokens.size() * 4);
  for (LayerState& l : s.state.layers) {
    if (l.conv.empty()) {  // attention
      f(l.k.data(), l.k.size() * 4);
      f(l.v.data(), l.v.size() * 4);
    } else {
      f(l.conv.data(), l.conv.size() * 4);
      f(l.ssm.data(), l.ssm.size() * 4);
    }
  }
  f(s.logits.data(), s.logits.size() * 4);
  f(s.note.data(), s.note.size());
}

uint64_t header_hash(const StateFileHeader& h) { return XXH3_64bits(&h, offsetof(StateFileHeader, header_xxh3)); }

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, std::min(n, size_t(1) << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= size_t(w);
  }
  return true;
}

bool read_all(int fd, void* p, size_t n, uint64_t offset) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::pread(fd, c, std::min(n, size_t(1) << 30), off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= size_t(r);
    offset += uint64_t(r);
  }
  return true;
}

std::string temp_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  const std::filesystem::path p(path);
  const size_t tid = std::hash<std::thread::id>{}(std::this_thread::get_id());
  return (p.parent_path() / (".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(tid % 1000000) + "-" +
                             std::to_string(counter.fetch_add(1)) + "-" + p.filename().string()))
      .string();
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void write_state_file(const std::string& path, uint64_t model_id, uint64_t key, const SavedState& s) {
  SWIFTLET_CHECK(s.state.tokens.size() == size_t(s.state.pos), "state of {} tokens at position {}",
                 s.state.tokens.size(), s.state.pos);
  StateFileHeader h{};
  std::memcpy(h.magic, kStateFileMagic, sizeof h.magic);
  h.version = kStateFileVersion;
  h.header_bytes = sizeof h;
  h.model_id = model_id;
  h.key = key;
  h.tokens = s.state.pos;
  h.logits_count = s.logits.size();
  h.note_bytes = s.note.size();

  const std::string tmp = temp_name(path);
  Fd f;
  f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (f.fd < 0)
    fail("cannot create {}: {} (check that the directory exists and is writable)", tmp, std::strerror(errno));
  bool ok = write_all(f.fd, &h, sizeof h);
  Hasher hash;
  uint64_t payload = 0;
  // The pieces are only read: for_each_piece takes a mutable state for the reader's sake.
  for_each_piece(const_cast<SavedState&>(s), [&](void* p, size_t n) {
    if (!ok) return;
    hash.add(p, n);
    payload += n;
    ok = write_all(f.fd, p, n);
  });
  h.payload_bytes = payload;
  h.payload_xxh3 = hash.digest();
  h.header_xxh3 = header_hash(h);
  ok = ok && ::pwrite(f.fd, &h, sizeof h, 0) == ssize_t(sizeof h) && ::fsync(f.fd) == 0;
  const int err = errno;
  ok = ::close(f.fd) == 0 && ok;
  f.fd = -1;
  if (ok && ::rename(tmp.c_str(), path.c_str()) == 0) {
    // The rename itself lasts once the directory is on disk.
    Fd d;
    d.fd = ::open(
        std::filesystem::path(path).parent_path().empty() ? "." : std::filesystem::path(path).parent_path().c_str(),
        O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d.fd >= 0) (void)::fsync(d.fd);
    return;
  }
  const int rename_err = errno;
  ::unlink(tmp.c_str());
  fail("cannot write {}: {} (free some disk space or choose another path)", path,
       std::strerror(ok    ? rename_err
                     : err ? err
                           : EIO));
}

std::optional<StateFileHeader> read_state_header(const std::string& path, std::string* why) {
  auto no = [&](std::string msg) -> std::optional<StateFileHeader> {
    if (why) *why = std::move(msg);
    return std::nullopt;
  };
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) return no(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return no(std::string("cannot stat: ") + std::strerror(errno));
  StateFileHeader h{};
  if (uint64_t(st.st_size) < sizeof h || !read_all(f.fd, &h, sizeof h, 0)) return no("truncated header");
  if (std::memcmp(h.magic, kStateFileMagic, sizeof h.magic) != 0) return no("not a swiftlet state file");
  if (h.version != kStateFileVersion)
    return no("format version " + std::to_string(h.version) + ", this build reads " +
              std::to_string(kStateFileVersion));
  if (h.header_bytes != sizeof h || header_hash(h) != h.header_xxh3) return no("corrupt header");
  if (uint64_t(st.st_size) != sizeof h + h.payload_bytes)
    return no("truncated: " + std::to_string(st.st_size) + " bytes, the header says " +
              std::to_string(sizeof h + h.payload_bytes));
  return h;
}

std::optional<SavedState> read_state_file(const std::string& path, const ModelConfig& cfg, uint64_t model_id,
                                          std::optional<uint64_t> key, std::string* why) {
  auto no = [&](std::string msg) -> std::optional<SavedState> {
    if (why) *why = std::move(msg);
    return std::nullopt;
  };
  std::optional<StateFileHeader> h = read_state_header(path, why);
  if (!h) return std::nullopt;
  if (h->model_id != model_id) return no("written by another model");
  if (key && h->key != *key) return no("another prefix's state");
  if (h->tokens < 0 || (h->logits_count != 0 && h->logits_count != uint64_t(cfg.vocab_size)) ||
      h->payload_bytes != state_payload_bytes(cfg, h->tokens, h->logits_count, h->note_bytes))
    return no("sizes do not fit this model's shape");

  SavedState s;
  s.state = SessionState::create(cfg);
  s.state.pos = h->tokens;
  s.state.tokens.resize(size_t(h->tokens));
  for (LayerState& l : s.state.layers)
    if (l.conv.empty()) {
      l.k.resize(size_t(h->tokens * cfg.kv_dim()));
      l.v.resize(l.k.size());
    }
  s.logits.resize(size_t(h->logits_count));
  s.note.resize(size_t(h->note_bytes));

  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) return no(std::string("cannot open: ") + std::strerror(errno));
  Hasher hash;
  uint64_t offset = sizeof(StateFileHeader);
  bool ok = true;
  for_each_piece(s, [&](void* p, size_t n) {
    if (!ok) return;
    ok = read_all(f.fd, p, n, offset);
    hash.add(p, n);
    offset += n;
  });
  if (!ok) return no("truncated payload");
  if (hash.digest() != h->payload_xxh3) return no("payload checksum mismatch (corrupt)");
  for (int32_t t : s.state.tokens)
    if (t < 0 || t >= cfg.vocab_size) return no("a token id outside the vocabulary");
  return s;
}

}  // namespace swiftlet
