// Routing traces: the file round-trips, bad files are refused with a message, and the replay
// mapping onto another model's shape follows docs/routing-trace.md (worked by hand below).
#include "experts/routing_trace.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <unistd.h>

namespace swiftlet {
namespace {

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string("swiftlet_") + name + std::to_string(::getpid())))
      .string();
}

RoutingTrace sample(bool weights, bool predictions) {
  RoutingTrace t;
  t.layers = 2;
  t.experts = 300;  // ids above 255: two bytes each
  t.top_k = 3;
  t.has_weights = weights;
  t.has_predictions = predictions;
  const uint16_t none = kNoPrediction;
  t.append(7, 151643, std::vector<uint16_t>{299, 0, 5, 1, 2, 3}, std::vector<float>{0.5f, 0.25f, 0.25f, 0.75f, 0.125f, 0.125f},
           std::vector<uint16_t>{none, none, none, 2, 1, 4});
  t.append(8, 42, std::vector<uint16_t>{9, 8, 7, 6, 5, 4}, std::vector<float>{1, 0, 0, 0.5f, 0.375f, 0.125f});
  if (!weights) t.weights.clear();
  return t;
}

TEST(RoutingTrace, RoundTrips) {
  for (bool weights : {false, true})
    for (bool predictions : {false, true}) {
      const std::string path = temp_path("trace");
      const RoutingTrace t = sample(weights, predictions);
      write_routing_trace(path, t);
      // 32-byte header + 2 records of 8 + 2 bytes x 6 per section (experts, weights, predictions).
      EXPECT_EQ(std::filesystem::file_size(path), 32u + 2 * (8 + 12 * (1 + weights + predictions)));
      const RoutingTrace r = read_routing_trace(path);
      EXPECT_EQ(r.layers, 2);
      EXPECT_EQ(r.experts, 300);
      EXPECT_EQ(r.top_k, 3);
      EXPECT_EQ(r.has_weights, weights);
      EXPECT_EQ(r.has_predictions, predictions);
      EXPECT_EQ(r.positions, (std::vector<int32_t>{7, 8}));
      EXPECT_EQ(r.tokens, (std::vector<int32_t>{151643, 42}));
      EXPECT_EQ(r.chosen, t.chosen);
      EXPECT_EQ(r.weights, t.weights);  // exact in fp16
      EXPECT_EQ(r.predicted, t.predicted);
      if (predictions) {
        EXPECT_TRUE(r.predicted_of(0, 0).empty());
        EXPECT_EQ(r.predicted_of(0, 1)[2], 4);
        EXPECT_TRUE(r.predicted_of(1, 1).empty());  // appended without a guess
      }
      std::remove(path.c_str());
    }
}

TEST(RoutingTrace, RefusesBadFiles) {
  const std::string path = temp_path("bad");
  auto message = [&] {
    try {
      read_routing_trace(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message().find("cannot open"), std::string::npos);
  std::ofstream(path) << "not a trace at all, but long enough for a header";
  EXPECT_NE(message().find("not a swiftlet routing trace"), std::string::npos);
  write_routing_trace(path, sample(true, true));
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  EXPECT_NE(message().find("truncated"), std::string::npos);
  RoutingTrace t = sample(false, false);
  t.chosen[4] = 300;  // expert 300 of 300
  write_routing_trace(path, t);
  EXPECT_NE(message().find("names expert 300 of 300"), std::string::npos);
  t.chosen[4] = t.chosen[3];  // token 0, layer 1: [1 1 3]
  write_routing_trace(path, t);
  EXPECT_NE(message().find("token 0 layer 1 names expert 1 twice"), std::string::npos) << message();
  std::remove(path.c_str());
}

TEST(RoutingTrace, ReplayMappingByHand) {
  // Trace: 2 layers, 4 experts, top-2, one token: layer 0 chose [3 1], layer 1 [2 3], and the
  // predictor had guessed [0 2] for layer 1.
  RoutingTrace t;
  t.layers = 2;
  t.experts = 4;
  t.top_k = 2;
  t.has_predictions = true;
  t.append(0, 0, std::vector<uint16_t>{3, 1, 2, 3}, {}, std::vector<uint16_t>{kNoPrediction, kNoPrediction, 0, 2});
  // Model: 4 layers, 8 experts, top-3. Model layer l uses trace layer floor(l * 2 / 4).
  TraceRouteOverride o(t, 4, 8, 3);
  std::vector<int32_t> got(3);
  // Layer 0 -> trace layer 0: 3 -> 3*8/4 + 0 = 6, 1 -> 2; then trace layer 1 (s = 1): 2 -> 5.
  o.route(0, 0, got);
  EXPECT_EQ(got, (std::vector<int32_t>{6, 2, 5}));
  o.route(1, 0, got);  // floor(1 * 2 / 4) = 0: the same
  EXPECT_EQ(got, (std::vector<int32_t>{6, 2, 5}));
  // Layer 2 -> trace layer 1: 2 -> 4, 3 -> 6; then trace layer 0 (s = 1): 3 -> 7.
  o.route(2, 5, got);  // position 5: trace token 5 mod 1 = 0
  EXPECT_EQ(got, (std::vector<int32_t>{4, 6, 7}));
  // Predictions: layer 2 -> trace layer 1's guess [0 2] -> 0, 4; trace layer 0 has none: false.
  EXPECT_FALSE(o.predict(2, 0, got));
  // Onto a model of 2 experts, top-2: everything maps to 0 or 1 (e * 2 / 4 + s mod 2):
  // layer 0: 3 -> 1, 1 -> 0.
  TraceRouteOverride small(t, 1, 2, 2);
  std::vector<int32_t> two(2);
  small.route(0, 0, two);
  EXPECT_EQ(two, (std::vector<int32_t>{1, 0}));
  // Onto the same shape: the identity.
  TraceRouteOverride same(t, 2, 4, 2);
  same.route(1, 0, two);
  EXPECT_EQ(two, (std::vector<int32_t>{2, 3}));
  EXPECT_TRUE(same.predict(1, 0, two));
  EXPECT_EQ(two, (std::vector<int32_t>{0, 2}));
}

}  // namespace
}  // namespace swiftlet
