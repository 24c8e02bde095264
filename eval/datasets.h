// Evaluation data sets (GSM8K test, MATH-500) and prompt files, read from
// JSONL. See shared/datasets/README.md for the files and their fields.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "eval/answers.h"

namespace lazykv::eval {

struct Problem {
  std::string id;        // "gsm8k/<line>" or MATH's unique_id
  std::string question;  // the problem text
  std::string gold;      // the reference final answer (GSM8K: the number after ####)
};

// The data directory when --data-dir is not given: $LAZYKV_DATA_DIR, else the
// shared/datasets folder beside the source tree.
std::string default_data_dir();

// data_dir/gsm8k_test.jsonl or data_dir/math500_test.jsonl. Error(kNotFound)
// naming the path when missing; Error(kInvalidArgument) with the line number
// for a malformed line (bad JSON, a missing or non-string field, a GSM8K
// answer without "#### <number>"). Blank lines are skipped.
std::vector<Problem> load_dataset(Dataset dataset, const std::string& data_dir);
std::string dataset_path(Dataset dataset, const std::string& data_dir);
std::vector<Problem> load_gsm8k(const std::string& path);
std::vector<Problem> load_math500(const std::string& path);

// Calls on_object(object, line number) for each non-blank line of a JSONL
// file. Error(kNotFound) "<what> not found: <path>" when missing;
// Error(kInvalidArgument) "<path>:<line>: ..." for a line that is not a JSON object.
void read_jsonl(const std::string& path, const std::string& what,
                const std::function<void(const nlohmann::json&, int64_t)>& on_object);

// Prompts from a JSONL file of {"prompt": "..."} objects (same errors).
std::vector<std::string> load_prompts(const std::string& path);

// The instruction after each problem: plain chain of thought, or chain of
// thought that checks its work (longer traces: the long-reasoning regime).
enum class Instruction { kCot, kCheck };
Instruction parse_instruction(const std::string& name);  // "cot" or "check"
const char* instruction_name(Instruction instruction);

// The user message for a problem: the problem, then the instruction asking
// for a \boxed{} answer.
std::string cot_message(const std::string& problem, Instruction instruction = Instruction::kCot);

}  // namespace lazykv::eval
