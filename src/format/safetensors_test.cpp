#include "format/safetensors.h"
#include "format/safetensors_writer.h"

#include "core/error.h"
#include "io/mapped_file.h"
#include "support/test_util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace swiftlet {
namespace {

namespace fs = std::filesystem;
using swiftlet::testing::error_of;

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string write_sample(const std::string& name) {
    std::string p = dir_ / name;
    write_safetensors(p, {{"b.weight", DType::F32, {2, 3}, fvals_},
                          {"a.bias", DType::BF16, {4}, hvals_}},
                      {{"format", "pt"}});
    return p;
  }
  static std::string slurp(const std::string& p) { return read_text_file(p); }
  static void dump(const std::string& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary) << bytes;
  }
  // Replaces the JSON header of a file with `json` (keeping the data bytes), padded with spaces to
  // a multiple of 8 bytes as the safetensors library writes it unless `pad` is false.
  static void rewrite_header(const std::string& p, std::string json, bool pad = true) {
    while (pad && json.size() % 8 != 0) json.push_back(' ');
    std::string b = slurp(p);
    uint64_t len;
    std::memcpy(&len, b.data(), 8);
    std::string data = b.substr(8 + len);
    uint64_t nl = json.size();
    std::string out(8, '\0');
    std::memcpy(out.data(), &nl, 8);
    dump(p, out + json + data);
  }
  swiftlet::testing::ScratchDir dir_;
  float fvals_[6] = {1, 2, 3, 4, 5, 6};
  uint16_t hvals_[4] = {0x3f80, 0x4000, 0xbf80, 0};
};

TEST_F(SafetensorsTest, RoundTrip) {
  SafetensorsFile f(write_sample("m.safetensors"));
  ASSERT_EQ(f.tensors().size(), 2u);
  const auto& a = f.tensors()[0];
  EXPECT_EQ(a.name, "a.bias");
  EXPECT_EQ(a.dtype, DType::BF16);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{4}));
  const auto& b = f.tensors()[1];
  EXPECT_EQ(b.shape_str(), "[2, 3]");
  float got[6];
  std::memcpy(got, b.data, 24);
  EXPECT_EQ(got[5], 6.0f);
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

TEST_F(SafetensorsTest, TruncatedFileIsAnErrorNamingTheTensor) {
  std::string p = write_sample("m.safetensors");
  std::string b = slurp(p);
  dump(p, b.substr(0, b.size() - 4));
  std::string e = error_of([&] { SafetensorsFile f(p); });
  EXPECT_NE(e.find("b.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST_F(SafetensorsTest, TooShortAndHugeHeader) {
  std::string p = dir_ / "x.safetensors";
  dump(p, "abc");
  EXPECT_NE(error_of([&] { SafetensorsFile f(p); }).find("too short"), std::string::npos);
  std::string b(16, '\0');
  uint64_t len = 1ull << 40;
  std::memcpy(b.data(), &len, 8);
  dump(p, b);
  EXPECT_NE(error_of([&] { SafetensorsFile f(p); }).find("header length"), std::string::npos);
}

TEST_F(SafetensorsTest, CorruptJson) {
  std::string p = write_sample("m.safetensors");
  rewrite_header(p, "{\"a\": [1,2");
  EXPECT_NE(error_of([&] { SafetensorsFile f(p); }).find("not a JSON object"), std::string::npos);
}

TEST_F(SafetensorsTest, ShapeDisagreesWithOffsets) {
  std::string p = write_sample("m.safetensors");
  rewrite_header(p, R"({"a":{"dtype":"F32","shape":[3,3],"data_offsets":[0,24]}})");
  std::string e = error_of([&] { SafetensorsFile f(p); });
  EXPECT_NE(e.find("'a'"), std::string::npos) << e;
  EXPECT_NE(e.find("needs 36 bytes"), std::string::npos) << e;
}

TEST_F(SafetensorsTest, OverlapAndBadDtype) {
  std::string p = write_sample("m.safetensors");
  rewrite_header(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})");
  EXPECT_NE(error_of([&] { SafetensorsFile f(p); }).find("overlap"), std::string::npos);
  rewrite_header(p, R"({"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}})");
  EXPECT_NE(error_of([&] { SafetensorsFile f(p); }).find("Q9"), std::string::npos);
  rewrite_header(p, R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})");
  EXPECT_NE(error_of([&] { SafetensorsFile f(p); }).find("non-negative"), std::string::npos);
}

TEST_F(SafetensorsTest, TensorsOffTheirElementAlignmentAreAnError) {
  std::string p = write_sample("m.safetensors");
  // 8 + 55 header bytes: the tensor would start at byte 63 of the file.
  const std::string h = R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})";
  ASSERT_EQ(h.size(), 55u);
  rewrite_header(p, h, /*pad=*/false);
  std::string e = error_of([&] { SafetensorsFile f(p); });
  EXPECT_NE(e.find("'a'"), std::string::npos) << e;
  EXPECT_NE(e.find("byte 63"), std::string::npos) << e;
  EXPECT_NE(e.find("save the file again"), std::string::npos) << e;
  // Aligned header (54 bytes padded to 56), F32 tensor at data offset 2: byte 8 + 56 + 2.
  rewrite_header(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})");
  e = error_of([&] { SafetensorsFile f(p); });
  EXPECT_NE(e.find("byte 66"), std::string::npos) << e;
  // Single bytes fit anywhere.
  rewrite_header(p, R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[1,4]}})", /*pad=*/false);
  EXPECT_NO_THROW(SafetensorsFile f(p));
}

TEST_F(SafetensorsTest, ShardedDirectoryWithIndex) {
  float x[2] = {1, 2};
  write_safetensors(dir_ / "s1.safetensors", {{"t1", DType::F32, {2}, x}});
  write_safetensors(dir_ / "s2.safetensors", {{"t2", DType::F32, {1}, x}});
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"metadata":{},"weight_map":{"t1":"s1.safetensors","t2":"s2.safetensors"}})";
  TensorSet set = TensorSet::open_dir(dir_.str());
  EXPECT_TRUE(set.contains("t1"));
  EXPECT_EQ(set.get("t2").numel(), 1);
  std::string e = error_of([&] { set.get("t3"); });
  EXPECT_NE(e.find("missing tensor 't3'"), std::string::npos) << e;

  // The index names a tensor that its shard does not hold.
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"weight_map":{"t1":"s1.safetensors","t9":"s2.safetensors"}})";
  EXPECT_NE(error_of([&] { TensorSet::open_dir(dir_.str()); }).find("t9"), std::string::npos);
  // A missing shard.
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"weight_map":{"t1":"s1.safetensors","t2":"s3.safetensors"}})";
  EXPECT_NE(error_of([&] { TensorSet::open_dir(dir_.str()); }).find("s3.safetensors"),
            std::string::npos);
}

TEST_F(SafetensorsTest, ReservedFileReadsItsBytesOnceAttachedAndRefusesAnotherHeader) {
  const std::string path = write_sample("m.safetensors");
  const std::string bytes = slurp(path);
  const std::string head = bytes.substr(0, safetensors_head_bytes(reinterpret_cast<const uint8_t*>(bytes.data())));
  const SafetensorsFile mapped(path);
  SafetensorsFile reserved(path, bytes.size(), head);
  EXPECT_FALSE(reserved.attached());
  ASSERT_EQ(reserved.tensors().size(), mapped.tensors().size());
  const uint8_t* before = reserved.tensors()[1].data;
  for (int round = 0; round < 2; ++round) {  // attached, detached, attached again: the same range
    reserved.attach();
    EXPECT_TRUE(reserved.attached());
    for (size_t i = 0; i < mapped.tensors().size(); ++i) {
      const TensorView &a = reserved.tensors()[i], &b = mapped.tensors()[i];
      ASSERT_EQ(a.name, b.name);
      ASSERT_EQ(a.nbytes, b.nbytes);
      EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes), 0) << a.name;
    }
    reserved.detach();
  }
  EXPECT_EQ(reserved.tensors()[1].data, before);

  std::string other = head;
  other.back() = other.back() == ' ' ? '\n' : ' ';
  SafetensorsFile changed(path, bytes.size(), other);
  std::string e = error_of([&] { changed.attach(); });
  EXPECT_NE(e.find("does not start with the header announced"), std::string::npos) << e;
  SafetensorsFile longer(path, bytes.size() + 8, head);
  e = error_of([&] { longer.attach(); });
  EXPECT_NE(e.find("expected " + std::to_string(bytes.size() + 8)), std::string::npos) << e;
  e = error_of([&] { SafetensorsFile(path, bytes.size(), head.substr(0, head.size() - 1)); });
  EXPECT_NE(e.find("do not hold its safetensors header"), std::string::npos) << e;
}

}  // namespace
}  // namespace swiftlet
