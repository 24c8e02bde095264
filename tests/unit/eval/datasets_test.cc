// Data set readers on small fixtures, malformed lines included.
#include "eval/datasets.h"

#include <gtest/gtest.h>

#include <string>

#include "common/error.h"

namespace lazykv::eval {
namespace {

const std::string kDir = std::string(LAZYKV_TEST_DATA_DIR) + "/eval";

// The Error's message for a call expected to throw, or "" when it did not throw.
template <typename F>
std::string error_of(F&& f, ErrorCode expected_code) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), expected_code) << e.what();
    return e.what();
  }
  return "";
}

TEST(DatasetsTest, ReadsGsm8k) {
  const std::vector<Problem> problems = load_dataset(Dataset::kGsm8k, kDir);
  ASSERT_EQ(problems.size(), 3u);  // the blank line is skipped
  EXPECT_EQ(problems[0].question, "Tom has 3 apples and buys 4 more. How many apples does he have?");
  EXPECT_EQ(problems[0].gold, "7");
  EXPECT_EQ(problems[1].gold, "1200");
  EXPECT_EQ(problems[2].gold, "-3");
  EXPECT_EQ(problems[2].id, "gsm8k/2");
}

TEST(DatasetsTest, ReadsMath500) {
  const std::vector<Problem> problems = load_dataset(Dataset::kMath500, kDir);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[0].question, "What is $\\frac{1}{2} + \\frac{1}{4}$?");
  EXPECT_EQ(problems[0].gold, "\\frac{3}{4}");
  EXPECT_EQ(problems[1].id, "test/algebra/2.json");
}

TEST(DatasetsTest, MissingFileNamesThePath) {
  const std::string message = error_of([] { load_dataset(Dataset::kGsm8k, kDir + "/nope"); }, ErrorCode::kNotFound);
  EXPECT_NE(message.find(kDir + "/nope/gsm8k_test.jsonl"), std::string::npos) << message;
}

TEST(DatasetsTest, MalformedLinesGiveTheLineNumber) {
  std::string message = error_of([] { load_gsm8k(kDir + "/gsm8k_bad_json.jsonl"); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("gsm8k_bad_json.jsonl:3"), std::string::npos) << message;
  EXPECT_NE(message.find("not valid JSON"), std::string::npos) << message;

  message = error_of([] { load_gsm8k(kDir + "/gsm8k_no_marker.jsonl"); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("gsm8k_no_marker.jsonl:2"), std::string::npos) << message;
  EXPECT_NE(message.find("####"), std::string::npos) << message;

  message = error_of([] { load_math500(kDir + "/math500_missing_field.jsonl"); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("math500_missing_field.jsonl:4"), std::string::npos) << message;
  EXPECT_NE(message.find("\"answer\""), std::string::npos) << message;
}

TEST(DatasetsTest, ReadsPromptsAndBuildsTheCotMessage) {
  const std::vector<std::string> prompts = load_prompts(kDir + "/prompts.jsonl");
  ASSERT_EQ(prompts.size(), 2u);
  EXPECT_EQ(prompts[1], "Name a colour.");
  EXPECT_EQ(cot_message("What is 2+2?"),
            "What is 2+2?\nPlease reason step by step, and put your final answer within \\boxed{}.");
  EXPECT_EQ(cot_message("What is 2+2?", parse_instruction("check")),
            "What is 2+2?\nPlease reason step by step. Then check your work: go over every step again, verify each "
            "calculation, and fix any mistake you find. Put your final answer within \\boxed{}.");
  EXPECT_EQ(instruction_name(parse_instruction("cot")), std::string("cot"));
  error_of([] { parse_instruction("verbose"); }, ErrorCode::kInvalidArgument);
  const std::string message = error_of([] { load_prompts(kDir + "/gsm8k_test.jsonl"); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find(":1: missing string field \"prompt\""), std::string::npos) << message;
}

}  // namespace
}  // namespace lazykv::eval
