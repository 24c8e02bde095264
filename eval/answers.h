// Final-answer extraction and comparison for the accuracy harness: GSM8K
// (numeric answers) and MATH-500 (LaTeX answers, normalised before comparing).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace lazykv::eval {

enum class Dataset { kGsm8k, kMath500 };

// "gsm8k" or "math500"; Error(kInvalidArgument) otherwise.
Dataset parse_dataset(const std::string& name);
const char* dataset_name(Dataset dataset);

// Content of the last complete \boxed{...} (or \fbox{...}) in text, braces
// balanced; "\boxed 5" (no braces) gives "5". Empty optional when none.
std::optional<std::string> last_boxed(std::string_view text);

// The last number in text ("-1,234.5" style; commas kept as written).
std::optional<std::string> last_number(std::string_view text);

// GSM8K gold: the number after "####" in the data set's `answer` field, commas
// removed. Empty optional when there is no "####" or no number after it.
std::optional<std::string> gsm8k_gold(std::string_view answer);

// The predicted answer of a completion: the last \boxed content; for GSM8K,
// without a \boxed, the last number of the text.
std::optional<std::string> extract_prediction(std::string_view completion, Dataset dataset);

// A GSM8K answer as a number: commas, $, %, \text{}, unit words and a
// trailing "." are ignored ("$1,000.00" -> 1000). Empty when not a number.
std::optional<double> parse_gsm8k_number(std::string_view answer);
bool gsm8k_equal(std::string_view prediction, std::string_view gold);

// MATH answer normalisation (whitespace, \left/\right, spacing commands,
// degrees, \$, dfrac/tfrac, \text{}, trailing ".", "x=" prefixes, \frac12 and
// \sqrt2 shorthands, a/b -> \frac{a}{b}).
std::string normalize_math_answer(std::string_view answer);
// A plain number or simple fraction ("-3", "0.5", "\frac{1}{2}", "-\frac{3}{4}", "3/4") as a value.
std::optional<double> parse_simple_number(std::string_view normalized);
bool math_equal(std::string_view prediction, std::string_view gold);

// The data set's comparison; false when there is no prediction.
bool answer_correct(const std::optional<std::string>& prediction, const std::string& gold, Dataset dataset);

}  // namespace lazykv::eval
