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

// Text passed before min_tokens is never matched on its own, but a stop
// string that begins in it and ends in pushed text stops generation (as
// vLLM finds it); what was passed was emitted already.
TEST(StopStrings, AStopBeginningInPassedTextCounts) {
  StopStringMatcher across({"ABC"});
  across.pass("hello AB");
  EXPECT_EQ(across.push("C world"), "");
  EXPECT_TRUE(across.stopped());

  StopStringMatcher before({"A", "XYZW"});
  before.pass("xA");  // "A" lies wholly before: no match
  EXPECT_EQ(before.push("y"), "y");
  EXPECT_FALSE(before.stopped());
  EXPECT_EQ(before.push("zA!"), "z");  // after min_tokens it does
  EXPECT_TRUE(before.stopped());

  StopStringMatcher held({"ABC"});
  held.pass("xxA");
  EXPECT_EQ(held.push("B"), "");  // "AB" may still become "ABC"
  EXPECT_EQ(held.push("D"), "BD");
  EXPECT_FALSE(held.stopped());

  StopStringMatcher late({"ABC"});
  late.pass("A");
  EXPECT_EQ(late.push("B"), "");
  EXPECT_EQ(late.push("Cdone"), "");
  EXPECT_TRUE(late.stopped());
}

TEST(StopStrings, NoStopsPassesEverything) {
  StopStringMatcher m({"", ""});
  EXPECT_EQ(m.push("abc"), "abc");
  EXPECT_FALSE(m.stopped());
}

}  // namespace
}  // namespace lazykv
