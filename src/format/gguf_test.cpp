#include "format/gguf.h"
#include "format/gguf_writer.h"

#include "core/error.h"
#include "support/test_util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace swiftlet {
namespace {

using swiftlet::testing::error_of;

// Raw GGUF bytes put together by hand, independently of GgufWriter, so that malformed files
// can be made too.
struct Raw {
  std::string b;
  template <typename T>
  Raw& put(T v) {
    char c[sizeof(T)];
    std::memcpy(c, &v, sizeof(T));
    b.append(c, sizeof(T));
    return *this;
  }
  Raw& str(const std::string& s) {
    put<uint64_t>(s.size());
    b += s;
    return *this;
  }
  Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b += "GGUF";
    return put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
  }
  Raw& kv_u32(const std::string& k, uint32_t v) { return str(k).put<uint32_t>(4).put<uint32_t>(v); }
  Raw& tensor(const std::string& name, std::vector<int64_t> ne, uint32_t type, uint64_t offset) {
    str(name).put<uint32_t>(uint32_t(ne.size()));
    for (int64_t d : ne) put<int64_t>(d);
    return put<uint32_t>(type).put<uint64_t>(offset);
  }
  Raw& pad(size_t align) {
    b.resize((b.size() + align - 1) / align * align, '\0');
    return *this;
  }
  Raw& floats(std::vector<float> v) {
    for (float f : v) put<float>(f);
    return *this;
  }
};

class GgufTest : public ::testing::Test {
 protected:
  std::string file(const std::string& bytes) {
    const std::string p = dir_ / ("f" + std::to_string(n_++) + ".gguf");
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  std::string error(const std::string& bytes) {
    const std::string p = file(bytes);
    return error_of([&] { GgufFile f(p); });
  }
  swiftlet::testing::ScratchDir dir_;
  int n_ = 0;
};

TEST_F(GgufTest, ReadsAHandBuiltFile) {
  // One key (alignment 64), two F32 tensors: "a" of 3 values at 0, "b" of [2, 2] at 64.
  Raw r;
  r.header(2, 1).kv_u32("general.alignment", 64);
  r.tensor("a", {3}, 0, 0).tensor("b", {2, 2}, 0, 64);
  const size_t table_end = r.b.size();
  r.pad(64);
  const size_t data = r.b.size();
  r.floats({1, 2, 3}).pad(64).floats({4, 5, 6, 7});
  GgufFile f(file(r.b));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset(), (table_end + 63) / 64 * 64);
  EXPECT_EQ(f.data_offset(), data);
  ASSERT_EQ(f.tensors().size(), 2u);
  const GgufTensor* b = f.find_tensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->offset, data + 64);
  EXPECT_EQ(b->nbytes, 16u);
  EXPECT_EQ(b->shape(), (std::vector<int64_t>{2, 2}));
  float got[4];
  std::memcpy(got, b->data, 16);
  EXPECT_EQ(got[0], 4.0f);
  EXPECT_EQ(got[3], 7.0f);
  EXPECT_EQ(f.find_tensor("a")->numel(), 3);
  EXPECT_EQ(f.find_tensor("c"), nullptr);
  EXPECT_EQ(f.get_int("general.alignment"), 64);
}

TEST_F(GgufTest, WriterRoundTripsEveryMetadataType) {
  GgufWriter w;
  w.set_string("general.architecture", "qwen3next");
  w.set_u32("qwen3next.block_count", 48);
  w.set_i32("tokenizer.ggml.bos_token_id", -1);
  w.set_u64("big", 1ull << 40);
  w.set_f32("eps", 1e-6f);
  w.set_bool("flag", true);
  w.set_strings("tokenizer.ggml.tokens", {"a", "", "\xc4\xa0hello"});
  w.set_i32s("tokenizer.ggml.token_type", {1, 3, -2});
  GgufValue f64s;
  f64s.type = GgufType::Array;
  f64s.elem = GgufType::F64;
  f64s.floats = {0.5, -2.25};
  w.set("floats", f64s);
  for (GgufType t : {GgufType::U8, GgufType::I8, GgufType::U16, GgufType::I16}) {
    GgufValue v;
    v.type = t;
    v.i = (t == GgufType::I8 || t == GgufType::I16) ? -7 : 200;
    w.set(std::string(gguf_type_name(t)), v);
  }
  std::string q8(34, '\x01');  // one Q8_0 block
  w.add_tensor("blk.0.attn_q.weight", GgmlType::Q8_0, {32, 1}, q8);
  w.add_tensor("token_embd.weight", GgmlType::F16, {4, 2}, std::string(16, '\x02'));
  GgufFile f(file(w.bytes()));
  EXPECT_EQ(f.get_string("general.architecture"), "qwen3next");
  EXPECT_EQ(f.get_int("qwen3next.block_count"), 48);
  EXPECT_EQ(f.get_int("tokenizer.ggml.bos_token_id"), -1);
  EXPECT_EQ(f.get_int("big"), int64_t(1) << 40);
  EXPECT_FLOAT_EQ(float(f.get_float("eps")), 1e-6f);
  EXPECT_EQ(f.get_int("flag"), 1);
  EXPECT_EQ(f.get_strings("tokenizer.ggml.tokens"), (std::vector<std::string>{"a", "", "\xc4\xa0hello"}));
  EXPECT_EQ(f.get_ints("tokenizer.ggml.token_type"), (std::vector<int64_t>{1, 3, -2}));
  EXPECT_EQ(f.find("floats")->floats, (std::vector<double>{0.5, -2.25}));
  EXPECT_EQ(f.get_int("u8"), 200);
  EXPECT_EQ(f.get_int("i8"), -7);
  EXPECT_EQ(f.get_int("u16"), 200);
  EXPECT_EQ(f.get_int("i16"), -7);
  const GgufTensor* q = f.find_tensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type_name(), "Q8_0");
  EXPECT_EQ(q->nbytes, 34u);
  EXPECT_EQ(q->offset % 32, 0u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(q->data), 34), q8);
  EXPECT_EQ(f.find_tensor("token_embd.weight")->shape_str(), "[2, 4]");
}

TEST_F(GgufTest, MetadataGettersNameTheKey) {
  GgufWriter w;
  w.set_string("s", "x");
  w.set_u32("n", 3);
  const std::string p = file(w.bytes());
  GgufFile f(p);
  EXPECT_NE(error_of([&] { f.get_int("missing.key"); }).find("missing.key"), std::string::npos);
  EXPECT_NE(error_of([&] { f.get_int("s"); }).find("not an integer"), std::string::npos);
  EXPECT_NE(error_of([&] { f.get_string("n"); }).find("not a string"), std::string::npos);
  EXPECT_NE(error_of([&] { f.get_strings("n"); }).find("not an array of strings"), std::string::npos);
  EXPECT_EQ(f.get_float("n"), 3.0);
}

TEST_F(GgufTest, BadHeadersAreClearErrors) {
  EXPECT_NE(error("GGU").find("not a GGUF file"), std::string::npos);
  EXPECT_NE(error("GGML" + std::string(20, '\0')).find("not a GGUF file"), std::string::npos);
  EXPECT_NE(error(Raw().header(0, 0, 1).b).find("version 1"), std::string::npos);
  // A big-endian file's version 3 reads as 0x03000000.
  EXPECT_NE(error(Raw().header(0, 0, 0x03000000).b).find("big-endian"), std::string::npos);
  EXPECT_NE(error(Raw().header(0, 0).b.substr(0, 12)).find("truncated"), std::string::npos);
}

TEST_F(GgufTest, CountsLargerThanTheFileAreRefusedBeforeAllocating) {
  EXPECT_NE(error(Raw().header(0, 1ull << 60).b).find("cannot fit"), std::string::npos);
  EXPECT_NE(error(Raw().header(uint64_t(-1), 0).b).find("cannot fit"), std::string::npos);
  // An array of 2^62 u32 values.
  Raw a;
  a.header(0, 1).str("arr").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(1ull << 62);
  EXPECT_NE(error(a.b).find("cannot fit"), std::string::npos);
  // A string longer than the file.
  Raw s;
  s.header(0, 1).put<uint64_t>(1ull << 50);
  s.b.append(16, 'x');
  const std::string e = error(s.b);
  EXPECT_NE(e.find("claims 1125899906842624 bytes, but only 16 are left"), std::string::npos) << e;
}

TEST_F(GgufTest, BadMetadataIsAnError) {
  Raw t;  // value type 13 does not exist
  t.header(0, 1).str("k").put<uint32_t>(13).put<uint32_t>(0);
  EXPECT_NE(error(t.b).find("value type 13"), std::string::npos);
  Raw nested;
  nested.header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(0);
  EXPECT_NE(error(nested.b).find("array of arrays"), std::string::npos);
  Raw dup;
  dup.header(0, 2).kv_u32("k", 1).kv_u32("k", 2);
  EXPECT_NE(error(dup.b).find("appears twice"), std::string::npos);
  Raw align;
  align.header(0, 1).kv_u32("general.alignment", 48);
  EXPECT_NE(error(align.b).find("power of two"), std::string::npos);
  Raw align0;
  align0.header(0, 1).kv_u32("general.alignment", 0);
  EXPECT_NE(error(align0.b).find("power of two"), std::string::npos);
  Raw align_type;
  align_type.header(0, 1).str("general.alignment").put<uint32_t>(8).str("32");
  EXPECT_NE(error(align_type.b).find("must be a u32"), std::string::npos);
}

// A file with one tensor's info as given and `data` bytes of data after the padding.
std::string one_tensor(std::vector<int64_t> ne, uint32_t type, uint64_t offset, size_t data) {
  Raw r;
  r.header(1, 0).tensor("w", std::move(ne), type, offset).pad(32);
  r.b.append(data, '\0');
  return r.b;
}

TEST_F(GgufTest, BadTensorInfosAreErrorsNamingTheTensor) {
  EXPECT_EQ(error(one_tensor({4, 2}, 0, 0, 32)), "(no error)");
  EXPECT_NE(error(one_tensor({4, 2}, 31, 0, 32)).find("type number 31"), std::string::npos);
  EXPECT_NE(error(one_tensor({4, 2}, 5000, 0, 32)).find("'w'"), std::string::npos);
  EXPECT_NE(error(one_tensor({16}, 8, 0, 32)).find("whole Q8_0 blocks of 32"), std::string::npos);
  EXPECT_NE(error(one_tensor({}, 0, 0, 32)).find("0 dimensions"), std::string::npos);
  EXPECT_NE(error(one_tensor({1, 1, 1, 1, 1}, 0, 0, 32)).find("5 dimensions"), std::string::npos);
  EXPECT_NE(error(one_tensor({4, -2}, 0, 0, 32)).find("negative"), std::string::npos);
  EXPECT_NE(error(one_tensor({1ll << 40, 1ll << 40}, 0, 0, 32)).find("overflows"), std::string::npos);
  EXPECT_NE(error(one_tensor({4, 2}, 0, 16, 64)).find("not a multiple of the file's alignment 32"), std::string::npos);
  const std::string past = error(one_tensor({4, 2}, 0, 0, 31));
  EXPECT_NE(past.find("'w'"), std::string::npos) << past;
  EXPECT_NE(past.find("truncated"), std::string::npos) << past;
  EXPECT_NE(error(one_tensor({4, 2}, 0, uint64_t(-32), 32)).find("ends past"), std::string::npos);
}

TEST_F(GgufTest, OverlapsAndDuplicateNamesAreErrors) {
  Raw o;
  o.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad(32);
  o.b.append(96, '\0');
  EXPECT_NE(error(o.b).find("overlap"), std::string::npos);
  Raw d;
  d.header(2, 0).tensor("a", {8}, 0, 0).tensor("a", {8}, 0, 32).pad(32);
  d.b.append(64, '\0');
  EXPECT_NE(error(d.b).find("appears twice"), std::string::npos);
}

TEST_F(GgufTest, EveryTruncationIsAnError) {
  GgufWriter w;
  w.set_string("general.architecture", "qwen35moe");
  w.set_strings("tokenizer.ggml.tokens", {"a", "bc"});
  w.add_tensor("t", GgmlType::Q4_0, {32, 2}, std::string(36, '\x11'));
  const std::string b = w.bytes();
  GgufFile whole(file(b));
  for (size_t n = 0; n < b.size(); ++n)
    EXPECT_NE(error(b.substr(0, n)), "(no error)") << "truncated to " << n << " bytes";
}

TEST_F(GgufTest, SplitModelsOpenEveryPart) {
  namespace fs = std::filesystem;
  auto part = [&](const std::string& tensor, int k, int n) {
    GgufWriter w;
    w.set_u32("split.count", uint32_t(n));
    w.add_tensor(tensor, GgmlType::F32, {2}, std::string(8, '\0'));
    const std::string p = dir_ / fmt::format("m-{:05d}-of-{:05d}.gguf", k, n);
    w.write(p);
    return p;
  };
  part("a", 1, 2);
  const std::string second = part("b", 2, 2);
  for (const std::string& open : {second, dir_.str()}) {
    const GgufModel m = GgufModel::open(open);
    EXPECT_EQ(m.files().size(), 2u);
    EXPECT_NE(m.find("a"), nullptr);
    EXPECT_NE(m.find("b"), nullptr);
    EXPECT_NE(error_of([&] { m.get("c"); }).find("no tensor 'c'"), std::string::npos);
  }
  part("a", 2, 2);  // the same tensor in both parts
  EXPECT_NE(error_of([&] { GgufModel::open(second); }).find("appears in both"), std::string::npos);
  fs::remove(second);
  EXPECT_NE(error_of([&] { GgufModel::open(dir_ / "m-00001-of-00002.gguf"); }).find("part 2 of 2"), std::string::npos);
  GgufWriter other;
  other.write(dir_ / "other.gguf");
  EXPECT_NE(error_of([&] { GgufModel::open(dir_.str()); }).find("more than one GGUF model"), std::string::npos);
  EXPECT_EQ(GgufModel::open(dir_ / "other.gguf").files().size(), 1u);
  EXPECT_NE(error_of([&] { GgufModel::open(dir_ / "none.gguf"); }).find("does not exist"), std::string::npos);
}

TEST_F(GgufTest, TypeNames) {
  EXPECT_EQ(ggml_type_name(17), "IQ2_XS");
  EXPECT_EQ(ggml_type_name(30), "BF16");
  EXPECT_EQ(ggml_type_name(4), "type 4");            // Q4_2, long removed
  EXPECT_EQ(ggml_type_info(14)->block_bytes, 210u);  // Q6_K
}

}  // namespace
}  // namespace swiftlet
