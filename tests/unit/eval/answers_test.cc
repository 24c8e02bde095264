// Answer extraction and comparison for GSM8K and MATH-500, table-driven.
#include "eval/answers.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace lazykv::eval {
namespace {

struct ExtractCase {
  std::string text;
  Dataset dataset;
  std::optional<std::string> expected;
};

TEST(AnswersTest, ExtractsPredictions) {
  const ExtractCase cases[] = {
      {"so the answer is \\boxed{18}.", Dataset::kGsm8k, "18"},
      {"\\boxed{1} then \\boxed{2}", Dataset::kGsm8k, "2"},
      {"\\boxed{\\frac{1}{2}}", Dataset::kMath500, "\\frac{1}{2}"},
      {"\\boxed{\\frac{\\sqrt{3}}{2}} done", Dataset::kMath500, "\\frac{\\sqrt{3}}{2}"},
      {"nested \\boxed{{a}{b{c}}}", Dataset::kMath500, "{a}{b{c}}"},
      {"spaced \\boxed {3 \\sqrt{2}} end", Dataset::kMath500, "3 \\sqrt{2}"},
      {"\\fbox{7}", Dataset::kMath500, "7"},
      {"$\\boxed 5$", Dataset::kMath500, "5"},
      {"no box here: 12 then 15", Dataset::kMath500, std::nullopt},
      {"no box here: 12 then 15", Dataset::kGsm8k, "15"},
      {"She pays $1,234.50 in total", Dataset::kGsm8k, "1,234.50"},
      {"The temperature is -3 degrees", Dataset::kGsm8k, "-3"},
      {"nothing numeric", Dataset::kGsm8k, std::nullopt},
      {"", Dataset::kGsm8k, std::nullopt},
      {"\\boxed{4} and then a cut-off \\boxed{12", Dataset::kGsm8k, "4"},
      {"only a cut-off \\boxed{12", Dataset::kMath500, std::nullopt},
      {"\\boxed{ 42 }", Dataset::kGsm8k, "42"},
      {"value 3.75.", Dataset::kGsm8k, "3.75"},
      {"\\boxed{(1, 2)}", Dataset::kMath500, "(1, 2)"},
  };
  for (const ExtractCase& c : cases) {
    EXPECT_EQ(extract_prediction(c.text, c.dataset), c.expected) << c.text;
  }
}

TEST(AnswersTest, Gsm8kGold) {
  EXPECT_EQ(gsm8k_gold("a\nb\n#### 18"), "18");
  EXPECT_EQ(gsm8k_gold("#### 1,200"), "1200");
  EXPECT_EQ(gsm8k_gold("#### -3"), "-3");
  EXPECT_EQ(gsm8k_gold("#### $5"), "5");
  EXPECT_EQ(gsm8k_gold("#### 2.5"), "2.5");
  EXPECT_EQ(gsm8k_gold("no marker 18"), std::nullopt);
  EXPECT_EQ(gsm8k_gold("#### none"), std::nullopt);
}

struct CompareCase {
  std::string prediction;
  std::string gold;
  bool equal;
};

TEST(AnswersTest, Gsm8kComparison) {
  const CompareCase cases[] = {
      {"18", "18", true},
      {"18.0", "18", true},
      {"18.00", "18", true},
      {"$18", "18", true},
      {"\\$18", "18", true},
      {"1,200", "1200", true},
      {"$1,200.00", "1200", true},
      {"18 dollars", "18", true},
      {"\\text{18 apples}", "18", true},
      {"25\\%", "25", true},
      {"25%", "25", true},
      {"18.", "18", true},
      {"x = 18", "18", true},
      {"-3", "-3", true},
      {"-3", "3", false},
      {"17", "18", false},
      {"18.5", "18", false},
      {"", "18", false},
      {"eighteen", "18", false},
      {"5 and 6", "56", false},
      {"\\frac{1}{2}", "0.5", true},
      {"0.5", "0.50", true},
      {"1000000", "1,000,000", true},
      {"100", "1000", false},
      {"3 hours", "3", true},
      {"+7", "7", true},
  };
  for (const CompareCase& c : cases) {
    EXPECT_EQ(gsm8k_equal(c.prediction, c.gold), c.equal) << c.prediction << " vs " << c.gold;
  }
}

TEST(AnswersTest, MathNormalisation) {
  EXPECT_EQ(normalize_math_answer("\\dfrac{1}{2}"), "\\frac{1}{2}");
  EXPECT_EQ(normalize_math_answer("\\frac12"), "\\frac{1}{2}");
  EXPECT_EQ(normalize_math_answer("\\frac1{22}"), "\\frac{1}{22}");
  EXPECT_EQ(normalize_math_answer("\\sqrt2"), "\\sqrt{2}");
  EXPECT_EQ(normalize_math_answer("x = 5"), "5");
  EXPECT_EQ(normalize_math_answer("\\left( 1, 2 \\right)"), "(1,2)");
  EXPECT_EQ(normalize_math_answer("90^\\circ"), "90");
  EXPECT_EQ(normalize_math_answer("3/4"), "\\frac{3}{4}");
  EXPECT_EQ(normalize_math_answer("\\text{(A)}"), "(A)");
  EXPECT_EQ(normalize_math_answer("5\\text{ cm}"), "5");
}

TEST(AnswersTest, MathComparison) {
  const CompareCase cases[] = {
      {"\\frac{1}{2}", "\\frac{1}{2}", true},
      {"\\dfrac{1}{2}", "\\frac{1}{2}", true},
      {"\\tfrac{1}{2}", "\\frac{1}{2}", true},
      {"\\frac12", "\\frac{1}{2}", true},
      {"0.5", "\\frac{1}{2}", true},
      {"1/2", "\\frac{1}{2}", true},
      {"-\\frac{3}{4}", "-0.75", true},
      {"\\frac{-3}{4}", "-\\frac{3}{4}", true},
      {"\\sqrt2", "\\sqrt{2}", true},
      {"2\\sqrt{2}", "2\\sqrt2", true},
      {"x = 5", "5", true},
      {"y=-2", "-2", true},
      {"90^\\circ", "90", true},
      {"90^{\\circ}", "90", true},
      {"\\$5", "5", true},
      {"50\\%", "50", true},
      {"\\left(3, \\frac{\\pi}{2}\\right)", "(3,\\frac{\\pi}{2})", true},
      {"\\text{Evelyn}", "\\text{Evelyn}", true},
      {"\\text{(C)}", "(C)", true},
      {"10.", "10", true},
      {"10.0", "10", true},
      {"1,000", "1000", true},
      {"5\\text{ inches}", "5", true},
      {"\\!\\, 7\\;", "7", true},
      {"\\frac{14}{3}", "\\frac{14}{3}", true},
      {"\\frac{1}{3}", "0.33", false},
      {"\\frac{1}{2}", "\\frac{1}{3}", false},
      {"-5", "5", false},
      {"(1,2)", "(2,1)", false},
      {"x^2+1", "x^2+2", false},
      {"\\sqrt{3}", "\\sqrt{2}", false},
      {"", "5", false},
      {"\\pi", "3.14159", false},
  };
  for (const CompareCase& c : cases) {
    EXPECT_EQ(math_equal(c.prediction, c.gold), c.equal) << c.prediction << " vs " << c.gold;
  }
}

TEST(AnswersTest, AnswerCorrectNeedsAPrediction) {
  EXPECT_FALSE(answer_correct(std::nullopt, "5", Dataset::kGsm8k));
  EXPECT_TRUE(answer_correct(std::string("5"), "5", Dataset::kGsm8k));
  EXPECT_TRUE(answer_correct(std::string("\\frac{3}{4}"), "\\frac34", Dataset::kMath500));
  EXPECT_EQ(parse_dataset("gsm8k"), Dataset::kGsm8k);
  EXPECT_EQ(parse_dataset("math500"), Dataset::kMath500);
  EXPECT_THROW(parse_dataset("mmlu"), std::exception);
}

}  // namespace
}  // namespace lazykv::eval
