// End-to-end: `swiftlet chat MODEL --session FILE` saves a conversation on leaving and resumes it
// on the next start: a chat of two turns split over two runs answers the second turn exactly as
// one run of both does (greedy), prefilling only the new turn; a file that is not a saved chat
// is refused with the reason.
#include "support/test_util.h"
#include "support/tiny_model.h"

#include <gtest/gtest.h>

#include <fstream>

namespace swiftlet {
namespace {

using testing::run_binary;

TEST(ChatSession, ResumedConversationAnswersAsOneRun) {
  const std::string model = testing::tiny_qpack_with_tokenizer();
  testing::ScratchDir dir;
  const std::string file = dir / "chat.swst";
  const std::string flags = " --greedy -n 6 -q";
  const auto whole = run_binary("swiftlet", "chat " + model + " 'Hello there' 'Tell me more'" + flags, true);
  ASSERT_EQ(whole.status, 0) << whole.out;
  const size_t second = whole.out.find("> Tell me more\n");
  ASSERT_NE(second, std::string::npos) << whole.out;

  const auto first = run_binary("swiftlet", "chat " + model + " 'Hello there' --session " + file + flags, true);
  ASSERT_EQ(first.status, 0) << first.out;
  EXPECT_EQ(first.out, whole.out.substr(0, second));

  // With the statistics line this time: the resumed turn reuses the saved state.
  const auto resumed = run_binary("swiftlet", "chat " + model + " 'Tell me more' --session " + file + " --greedy -n 6");
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("[resumed 2 messages"), std::string::npos) << resumed.out;
  EXPECT_NE(resumed.out.find(whole.out.substr(second)), std::string::npos) << resumed.out << "\nwanted:\n"
                                                                           << whole.out.substr(second);
  EXPECT_EQ(resumed.out.find(" 0 reused"), std::string::npos) << resumed.out;
  EXPECT_NE(resumed.out.find("[conversation saved to " + file + "]"), std::string::npos) << resumed.out;

  std::ofstream(file, std::ios::binary | std::ios::trunc) << "not a state";
  const auto bad = run_binary("swiftlet", "chat " + model + " 'Hi' --session " + file + flags);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("cannot resume from " + file), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace swiftlet
