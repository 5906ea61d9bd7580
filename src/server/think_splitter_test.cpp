#include "server/think_splitter.h"

#include <gtest/gtest.h>

namespace swiftlet::server {
namespace {

// Feeds `text` one byte at a time (the worst case for held-back tags) and joins the outputs.
ThinkSplitter::Out split_bytewise(const std::string& text, bool opened) {
  ThinkSplitter s(opened);
  ThinkSplitter::Out all;
  for (char c : text) {
    auto o = s.feed(std::string(1, c));
    all.reasoning += o.reasoning;
    all.content += o.content;
  }
  auto o = s.flush();
  all.reasoning += o.reasoning;
  all.content += o.content;
  return all;
}

TEST(ThinkSplitter, SplitsABlockAtTheStart) {
  for (bool bytewise : {false, true}) {
    ThinkSplitter::Out o;
    const std::string text = "<think>\nLet me see.\n</think>\n\nThe answer is 4.";
    if (bytewise) {
      o = split_bytewise(text, false);
    } else {
      ThinkSplitter s;
      o = s.feed(text);
      auto r = s.flush();
      o.content += r.content;
    }
    EXPECT_EQ(o.reasoning, "Let me see.\n");
    EXPECT_EQ(o.content, "The answer is 4.");
  }
}

TEST(ThinkSplitter, PromptThatOpenedTheBlock) {
  auto o = split_bytewise("I think 4.\n</think>\n\n4", /*opened=*/true);
  EXPECT_EQ(o.reasoning, "I think 4.\n");
  EXPECT_EQ(o.content, "4");
}

TEST(ThinkSplitter, NoBlockIsAllContent) {
  auto o = split_bytewise("Hello <think> is not a tag here", false);
  EXPECT_EQ(o.reasoning, "");
  EXPECT_EQ(o.content, "Hello <think> is not a tag here");
  o = split_bytewise("<thin", false);  // a tag that never completes
  EXPECT_EQ(o.content, "<thin");
}

TEST(ThinkSplitter, UnclosedBlockStaysReasoning) {
  auto o = split_bytewise("<think>still thinking </thi", false);
  EXPECT_EQ(o.reasoning, "still thinking </thi");
  EXPECT_EQ(o.content, "");
}

}  // namespace
}  // namespace swiftlet::server
