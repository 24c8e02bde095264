#include "coordinator/tokenizer/stop_strings.h"

#include <gtest/gtest.h>

namespace lazykv {
namespace {

TEST(StopStrings, StopsAtFirstMatchAcrossChunks) {
  StopStringMatcher m({"\nUser:", "###"});
  std::string out;
  for (const char* chunk : {"Hello", " world", "\nUs", "er: more"}) out += m.push(chunk);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(out, "Hello world");
  EXPECT_EQ(m.push("ignored"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStrings, HoldsBackOnlyPossiblePrefixes) {
  StopStringMatcher m({"###"});
  EXPECT_EQ(m.push("a#"), "a");
  EXPECT_EQ(m.push("b"), "#b");
  EXPECT_EQ(m.push("##"), "");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.flush(), "##");
}

TEST(StopStrings, NoStopsPassesEverything) {
  StopStringMatcher m({"", ""});
  EXPECT_EQ(m.push("abc"), "abc");
  EXPECT_FALSE(m.stopped());
}

}  // namespace
}  // namespace lazykv
