#include "core/zstd_frame.h"

#include <gtest/gtest.h>

#include <random>

#include "core/error.h"

namespace swiftlet {
namespace {

// `printf 'hello world\n' | zstd -19 -c` (the zstd command-line tool, v1.5.4).
const unsigned char kHelloFrame[] = {0x28, 0xb5, 0x2f, 0xfd, 0x04, 0x68, 0x61, 0x00, 0x00, 0x68, 0x65,
                                     0x6c, 0x6c, 0x6f, 0x20, 0x77, 0x6f, 0x72, 0x6c, 0x64, 0x0a, 0x8c,
                                     0x6d, 0x7d, 0x20};

std::string hello_frame() { return std::string(reinterpret_cast<const char*>(kHelloFrame), sizeof kHelloFrame); }

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ZstdFrame, ReadsAFrameOfTheCommandLineTool) {
  EXPECT_TRUE(is_zstd_frame(hello_frame()));
  EXPECT_EQ(zstd_decompress(hello_frame(), "x"), "hello world\n");
  EXPECT_EQ(zstd_decompress(hello_frame() + hello_frame(), "x"), "hello world\nhello world\n");
}

TEST(ZstdFrame, PlainTextIsNoFrame) {
  EXPECT_FALSE(is_zstd_frame("{\"version\":\"1.0\"}"));
  EXPECT_FALSE(is_zstd_frame(""));
  EXPECT_FALSE(is_zstd_frame(std::string("\x28\xb5\x2f", 3)));
}

TEST(ZstdFrame, RoundTripsLargeInput) {
  std::mt19937 rng(7);
  std::string text;
  for (int i = 0; i < 300000; ++i) text += "abcdefgh "[rng() % 9];  // compressible, ~300 KB
  const std::string z = zstd_compress(text);
  EXPECT_LT(z.size(), text.size() / 2);
  EXPECT_EQ(zstd_decompress(z, "x"), text);
}

TEST(ZstdFrame, DamagedTruncatedOrOversizedFramesAreErrors) {
  const std::string good = hello_frame();
  EXPECT_NE(message_of([&] { zstd_decompress(good.substr(0, good.size() - 3), "tok.zst"); }).find("truncated"),
            std::string::npos);
  EXPECT_NE(message_of([&] { zstd_decompress(good.substr(0, 4), "tok.zst"); }).find("tok.zst"), std::string::npos);
  std::string bad = good;
  bad[5] = char(0xff);  // the frame header's descriptor
  EXPECT_NE(message_of([&] { zstd_decompress(bad, "tok.zst"); }).find("tok.zst"), std::string::npos);
  EXPECT_THROW(zstd_decompress(good + "garbage", "x"), Error);
  EXPECT_THROW(zstd_decompress("", "x"), Error);
  EXPECT_NE(message_of([&] { zstd_decompress(good, "tok.zst", 5); }).find("more than 5 bytes"), std::string::npos);
}

}  // namespace
}  // namespace swiftlet
