#include "eval/datasets.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/error.h"

#ifndef LAZYKV_SOURCE_DIR
#define LAZYKV_SOURCE_DIR "."
#endif

namespace lazykv::eval {
namespace {

std::string string_field(const nlohmann::json& object, const std::string& field, const std::string& path,
                         int64_t line) {
  auto it = object.find(field);
  if (it == object.end() || !it->is_string()) {
    throw Error(ErrorCode::kInvalidArgument,
                path + ":" + std::to_string(line) + ": missing string field \"" + field + "\"");
  }
  return it->get<std::string>();
}

}  // namespace

void read_jsonl(const std::string& path, const std::string& what,
                const std::function<void(const nlohmann::json&, int64_t)>& on_object) {
  if (!std::filesystem::is_regular_file(path)) {
    throw Error(ErrorCode::kNotFound, what + " not found: " + path);
  }
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::kNotFound, "cannot open " + what + " " + path);
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorCode::kInvalidArgument,
                  path + ":" + std::to_string(number) + ": not valid JSON (" + e.what() + ")");
    }
    if (!object.is_object()) {
      throw Error(ErrorCode::kInvalidArgument, path + ":" + std::to_string(number) + ": not a JSON object");
    }
    on_object(object, number);
  }
}

std::string default_data_dir() {
  if (const char* env = std::getenv("LAZYKV_DATA_DIR"); env != nullptr && *env != '\0') return env;
  return (std::filesystem::path(LAZYKV_SOURCE_DIR) / ".." / "shared" / "datasets").lexically_normal().string();
}

std::string dataset_path(Dataset dataset, const std::string& data_dir) {
  const char* file = dataset == Dataset::kGsm8k ? "gsm8k_test.jsonl" : "math500_test.jsonl";
  return (std::filesystem::path(data_dir) / file).string();
}

std::vector<Problem> load_dataset(Dataset dataset, const std::string& data_dir) {
  const std::string path = dataset_path(dataset, data_dir);
  return dataset == Dataset::kGsm8k ? load_gsm8k(path) : load_math500(path);
}

std::vector<Problem> load_gsm8k(const std::string& path) {
  std::vector<Problem> problems;
  read_jsonl(path, "data file", [&](const nlohmann::json& object, int64_t line) {
    Problem p;
    p.id = "gsm8k/" + std::to_string(problems.size());
    p.question = string_field(object, "question", path, line);
    const std::optional<std::string> gold = gsm8k_gold(string_field(object, "answer", path, line));
    if (!gold) {
      throw Error(ErrorCode::kInvalidArgument,
                  path + ":" + std::to_string(line) + ": the answer has no \"#### <number>\" final answer");
    }
    p.gold = *gold;
    problems.push_back(std::move(p));
  });
  return problems;
}

std::vector<Problem> load_math500(const std::string& path) {
  std::vector<Problem> problems;
  read_jsonl(path, "data file", [&](const nlohmann::json& object, int64_t line) {
    Problem p;
    p.question = string_field(object, "problem", path, line);
    p.gold = string_field(object, "answer", path, line);
    auto id = object.find("unique_id");
    p.id = id != object.end() && id->is_string() ? id->get<std::string>() : "math500/" + std::to_string(problems.size());
    problems.push_back(std::move(p));
  });
  return problems;
}

std::vector<std::string> load_prompts(const std::string& path) {
  std::vector<std::string> prompts;
  read_jsonl(path, "data file", [&](const nlohmann::json& object, int64_t line) {
    prompts.push_back(string_field(object, "prompt", path, line));
  });
  return prompts;
}

Instruction parse_instruction(const std::string& name) {
  if (name == "cot") return Instruction::kCot;
  if (name == "check") return Instruction::kCheck;
  throw Error(ErrorCode::kInvalidArgument, "--instruction: '" + name + "' is not cot or check");
}

const char* instruction_name(Instruction instruction) { return instruction == Instruction::kCot ? "cot" : "check"; }

std::string cot_message(const std::string& problem, Instruction instruction) {
  if (instruction == Instruction::kCheck) {
    return problem +
           "\nPlease reason step by step. Then check your work: go over every step again, verify each calculation, "
           "and fix any mistake you find. Put your final answer within \\boxed{}.";
  }
  return problem + "\nPlease reason step by step, and put your final answer within \\boxed{}.";
}

}  // namespace lazykv::eval
