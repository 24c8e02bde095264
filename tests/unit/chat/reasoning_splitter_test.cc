#include "coordinator/chat/reasoning_splitter.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"

namespace lazykv {
namespace {

// The whole reply pushed in pieces cut at `cuts`, then flushed.
ReasoningPiece split(ReasoningFormat format, bool opened, const std::string& reply, const std::vector<size_t>& cuts) {
  ReasoningSplitter splitter(format, opened);
  ReasoningPiece all;
  size_t from = 0;
  const auto add = [&](const ReasoningPiece& p) {
    all.reasoning += p.reasoning;
    all.content += p.content;
  };
  for (size_t cut : cuts) {
    add(splitter.push(std::string_view(reply).substr(from, cut - from)));
    from = cut;
  }
  add(splitter.push(std::string_view(reply).substr(from)));
  add(splitter.flush());
  return all;
}

struct Case {
  ReasoningFormat format;
  bool opened_by_prompt;
  std::string reply, reasoning, content;
};

const std::vector<Case> kCases = {
    {ReasoningFormat::kThink, false, "<think>\nLet me add.\n</think>\n\nThe answer is 4.", "\nLet me add.\n",
     "The answer is 4."},
    {ReasoningFormat::kThink, false, "\n <think>a</think>b", "a", "b"},
    {ReasoningFormat::kThink, true, "Let me add: 2+2.</think>\n4", "Let me add: 2+2.", "4"},
    {ReasoningFormat::kThink, true, "still thinking </thi", "still thinking </thi", ""},  // never closed
    {ReasoningFormat::kThink, false, "<think>still thinking", "still thinking", ""},
    {ReasoningFormat::kThink, false, "  Hello <think> there </think>", "", "  Hello <think> there </think>"},
    {ReasoningFormat::kThink, false, "<thin", "", "<thin"},
    {ReasoningFormat::kThink, false, "<think></think>", "", ""},
    {ReasoningFormat::kThink, false, "<think>x</think>\n\n", "x", ""},
    {ReasoningFormat::kThink, false, "<think>a < b </ c</think>ok </think>", "a < b </ c", "ok </think>"},
    {ReasoningFormat::kThink, true, "é</think>ü", "é", "ü"},
    {ReasoningFormat::kNone, true, "<think>a</think>b", "", "<think>a</think>b"},
};

TEST(ReasoningSplitter, WholeRepliesSplitAsDefined) {
  for (const Case& c : kCases) {
    const ReasoningPiece got = split(c.format, c.opened_by_prompt, c.reply, {});
    EXPECT_EQ(got.reasoning, c.reasoning) << c.reply;
    EXPECT_EQ(got.content, c.content) << c.reply;
  }
}

// A marker may arrive in any number of pieces: every way of cutting a reply
// in two or three gives the same split as the whole reply.
TEST(ReasoningSplitter, EveryCutGivesTheSameSplit) {
  for (const Case& c : kCases) {
    for (size_t a = 0; a <= c.reply.size(); ++a) {
      for (size_t b = a; b <= c.reply.size(); ++b) {
        const ReasoningPiece got = split(c.format, c.opened_by_prompt, c.reply, {a, b});
        ASSERT_EQ(got.reasoning, c.reasoning) << c.reply << " cut at " << a << ", " << b;
        ASSERT_EQ(got.content, c.content) << c.reply << " cut at " << a << ", " << b;
      }
    }
  }
}

TEST(ReasoningSplitter, ThinkingSaysWhereTheNextTextGoes) {
  ReasoningSplitter s(ReasoningFormat::kThink, false);
  EXPECT_FALSE(s.thinking());
  EXPECT_EQ(s.push("<thi").reasoning, "");
  EXPECT_FALSE(s.thinking());  // not decided yet
  s.push("nk>plan");
  EXPECT_TRUE(s.thinking());
  const ReasoningPiece p = s.push("</think>done");
  EXPECT_EQ(p.reasoning, "");  // "plan" went out with the previous piece
  EXPECT_EQ(p.content, "done");
  EXPECT_FALSE(s.thinking());
}

TEST(ReasoningSplitter, FormatsByNameAndFromTheTemplate) {
  EXPECT_EQ(parse_reasoning_format("none"), ReasoningFormat::kNone);
  EXPECT_EQ(parse_reasoning_format("think"), ReasoningFormat::kThink);
  EXPECT_EQ(parse_reasoning_format("deepseek_r1"), ReasoningFormat::kThink);
  EXPECT_EQ(parse_reasoning_format("qwen3"), ReasoningFormat::kThink);
  try {
    parse_reasoning_format("granite");
    FAIL() << "an unknown parser was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("known: auto, none, think"), std::string::npos) << e.what();
  }
  EXPECT_EQ(reasoning_format_of_template("{{ '<|Assistant|><think>\\n' }}"), ReasoningFormat::kThink);
  EXPECT_EQ(reasoning_format_of_template("{{ '<|im_start|>assistant\\n' }}"), ReasoningFormat::kNone);
  EXPECT_TRUE(prompt_opens_thinking("<|Assistant|><think>\n"));
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));  // Qwen3, thinking off
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n"));
}

}  // namespace
}  // namespace lazykv
