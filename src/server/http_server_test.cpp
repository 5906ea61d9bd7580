// The transport's pure helpers: loopback detection and the API key check.
#include "server/http_server.h"

#include <gtest/gtest.h>

namespace swiftlet::server {
namespace {

TEST(HttpServer, LoopbackHosts) {
  for (const char* h : {"127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]"}) EXPECT_TRUE(is_loopback_host(h)) << h;
  for (const char* h : {"0.0.0.0", "::", "192.168.1.5", "10.0.0.1", "128.0.0.1", "example.com", ""})
    EXPECT_FALSE(is_loopback_host(h)) << h;
}

TEST(HttpServer, ApiKeyMatchesOnlyTheKey) {
  const std::string key = "sk-0123456789abcdef";
  EXPECT_TRUE(api_key_matches(key, key));
  EXPECT_TRUE(api_key_matches(std::string(key), std::string_view(key.data(), key.size())));
  EXPECT_FALSE(api_key_matches("", key));
  EXPECT_FALSE(api_key_matches("sk-0123456789abcdeF", key));  // last byte
  EXPECT_FALSE(api_key_matches("Sk-0123456789abcdef", key));  // first byte
  EXPECT_FALSE(api_key_matches("sk-0123456789abcde", key));   // a prefix
  EXPECT_FALSE(api_key_matches(key + "0", key));              // longer
  EXPECT_FALSE(api_key_matches(std::string("sk-0123456789abcdef\0", 20), key));
  EXPECT_TRUE(api_key_matches("", ""));
}

}  // namespace
}  // namespace swiftlet::server
