// The records file of eval accuracy: written line by line, read back by
// --resume, refused when it belongs to another run.
#include "eval/accuracy_records.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/unit/temp_dir.h"

namespace lazykv::eval {
namespace {

const std::vector<Problem> kProblems = {{"gsm8k/1", "q1", "7"}, {"gsm8k/2", "q2", "8"}, {"gsm8k/3", "q3", "9"}};

nlohmann::json header(int32_t max_tokens = 64, const AccuracyOptions& base = {}) {
  AccuracyOptions options = base;
  options.max_tokens = max_tokens;
  return accuracy_records_header("tiny", "/nonexistent/tiny.gguf", options, "f32");
}

AccuracyRecord record(size_t problem, const std::string& policy, double ratio, bool correct) {
  AccuracyRecord r;
  r.problem = problem;
  r.policy = policy;
  r.budget_ratio = ratio;
  r.budget_slots = policy == "full" ? 0 : 20;
  r.generated_tokens = 30 + int64_t(problem);
  r.peak_kv_bytes = 4096 * (1 + int64_t(problem));
  r.mean_kv_bytes = 3072.5 * double(1 + problem);
  r.finish = "stop";
  if (correct) r.prediction = kProblems[problem].gold;
  r.correct = correct;
  return r;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

void expect_error(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no error, expected one mentioning " << fragment;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(AccuracyRecordsTest, RecordsRoundTripThroughResume) {
  TempDir dir("accuracy_records");
  const std::string path = dir.file("records.jsonl");
  {
    AccuracyRecordLog log(path, header(), /*resume=*/false, kProblems);
    EXPECT_TRUE(log.resumed().empty());
    log.append(record(0, "full", 1.0, true));
    AccuracyRecord failed = record(1, "lazy", 0.3, false);
    failed.error = "prompt too long";
    failed.finish = "error";
    log.append(failed);
  }
  ASSERT_EQ(read_lines(path).size(), 3u);  // header + 2 records

  AccuracyRecordLog log(path, header(), /*resume=*/true, kProblems);
  ASSERT_EQ(log.resumed().size(), 2u);
  const AccuracyRecord& full = log.resumed()[0];
  EXPECT_EQ(full.problem, 0u);
  EXPECT_EQ(full.policy, "full");
  EXPECT_EQ(full.budget_ratio, 1.0);
  EXPECT_TRUE(full.correct);
  EXPECT_EQ(full.prediction, std::optional<std::string>("7"));
  EXPECT_EQ(full.generated_tokens, 30);
  EXPECT_EQ(full.peak_kv_bytes, 4096);
  EXPECT_EQ(full.mean_kv_bytes, 3072.5);
  const AccuracyRecord& failed = log.resumed()[1];
  EXPECT_EQ(failed.problem, 1u);
  EXPECT_EQ(failed.budget_ratio, 0.3);
  EXPECT_EQ(failed.budget_slots, 20);
  EXPECT_FALSE(failed.prediction.has_value());
  EXPECT_EQ(failed.error, "prompt too long");
  EXPECT_EQ(failed.finish, "error");
  EXPECT_FALSE(log.dropped_torn_line());
  // New records go after the old ones.
  log.append(record(2, "full", 1.0, false));
  EXPECT_EQ(read_lines(path).size(), 4u);
}

// A record written before the mean KV was kept resumes with it unknown (0).
TEST(AccuracyRecordsTest, RecordsWithoutTheMeanKvResume) {
  TempDir dir("accuracy_records");
  const std::string path = dir.file("records.jsonl");
  nlohmann::json old = accuracy_record_json(record(0, "full", 1.0, true), kProblems);
  old.erase("mean_kv_bytes");
  std::ofstream(path) << header().dump() << "\n" << old.dump() << "\n";
  nlohmann::json tiered = accuracy_record_json(record(1, "lazy+tiers", 0.3, false), kProblems);
  tiered.erase("tiers");
  std::ofstream(path, std::ios::app) << tiered.dump() << "\n";
  AccuracyRecordLog log(path, header(), /*resume=*/true, kProblems);
  ASSERT_EQ(log.resumed().size(), 2u);
  EXPECT_EQ(log.resumed()[0].mean_kv_bytes, 0.0);
  EXPECT_EQ(log.resumed()[0].peak_kv_bytes, 4096);
  EXPECT_TRUE(log.resumed()[0].tiers.tiers_available);  // not a tiered policy
  EXPECT_FALSE(log.resumed()[1].tiers.tiers_available);  // what its tiers moved is unknown
}

TEST(AccuracyRecordsTest, WithoutResumeTheFileStartsAfresh) {
  TempDir dir("accuracy_records");
  const std::string path = dir.file("records.jsonl");
  AccuracyRecordLog(path, header(), false, kProblems).append(record(0, "full", 1.0, true));
  AccuracyRecordLog log(path, header(), /*resume=*/false, kProblems);
  EXPECT_TRUE(log.resumed().empty());
  EXPECT_EQ(read_lines(path).size(), 1u);
  // --resume on a file that does not exist yet starts one.
  AccuracyRecordLog fresh(dir.file("new.jsonl"), header(), /*resume=*/true, kProblems);
  EXPECT_TRUE(fresh.resumed().empty());
  EXPECT_EQ(read_lines(dir.file("new.jsonl")).size(), 1u);
}

TEST(AccuracyRecordsTest, RecordsOfOtherProblemsStayInTheFile) {
  TempDir dir("accuracy_records");
  const std::string path = dir.file("records.jsonl");
  {
    AccuracyRecordLog log(path, header(), false, kProblems);
    for (size_t i = 0; i < 3; ++i) log.append(record(i, "full", 1.0, i == 1));
  }
  // A run over the last two problems only (--offset 1): problem 3 is the
  // first of its slice.
  const std::vector<Problem> slice(kProblems.begin() + 1, kProblems.end());
  AccuracyRecordLog log(path, header(), true, slice);
  ASSERT_EQ(log.resumed().size(), 2u);
  EXPECT_EQ(log.resumed()[0].problem, 0u);
  EXPECT_TRUE(log.resumed()[0].correct);  // gsm8k/2
  EXPECT_EQ(log.resumed()[1].problem, 1u);
  EXPECT_EQ(read_lines(path).size(), 4u);  // gsm8k/1's record is kept
  // And a later run over all three still finds it.
  EXPECT_EQ(AccuracyRecordLog(path, header(), true, kProblems).resumed().size(), 3u);
}

TEST(AccuracyRecordsTest, TornLastLineIsDroppedAndTheFileMadeWhole) {
  TempDir dir("accuracy_records");
  const std::string path = dir.file("records.jsonl");
  {
    AccuracyRecordLog log(path, header(), false, kProblems);
    log.append(record(0, "full", 1.0, true));
  }
  {
    std::ofstream out(path, std::ios::app);
    out << R"({"id": "gsm8k/2", "policy": "fu)";  // a run killed mid-write
  }
  AccuracyRecordLog log(path, header(), true, kProblems);
  EXPECT_TRUE(log.dropped_torn_line());
  EXPECT_EQ(log.resumed().size(), 1u);
  log.append(record(1, "full", 1.0, false));
  const std::vector<std::string> lines = read_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  for (const std::string& line : lines) EXPECT_FALSE(nlohmann::json::parse(line, nullptr, false).is_discarded()) << line;
}

TEST(AccuracyRecordsTest, RefusesAnotherRunsFile) {
  TempDir dir("accuracy_records");
  const std::string path = dir.file("records.jsonl");
  AccuracyRecordLog(path, header(64), false, kProblems).append(record(0, "full", 1.0, true));
  expect_error([&] { AccuracyRecordLog(path, header(128), true, kProblems); }, "max_tokens 64, this run has 128");
  AccuracyOptions math, generated, mean, loops, check;
  check.instruction = Instruction::kCheck;
  expect_error([&] { AccuracyRecordLog(path, header(64, check), true, kProblems); },
               "instruction unset, this run has \"check\"");
  math.dataset = Dataset::kMath500;
  expect_error([&] { AccuracyRecordLog(path, header(64, math), true, kProblems); }, "dataset");
  // Budgets set another way, or another loop stop: the answers differ.
  generated.budget_base = BudgetBase::kGenerated;
  mean.match = BudgetMatch::kMean;
  loops.loop_window = 256;
  expect_error([&] { AccuracyRecordLog(path, header(64, generated), true, kProblems); },
               "budget_base unset, this run has \"generated\"");
  expect_error([&] { AccuracyRecordLog(path, header(64, mean), true, kProblems); }, "match unset, this run has \"mean\"");
  expect_error([&] { AccuracyRecordLog(path, header(64, loops), true, kProblems); },
               "loop_window unset, this run has 256");
  // And the other way: a file that names a setting this run leaves at its default.
  const std::string other = dir.file("generated.jsonl");
  AccuracyRecordLog(other, header(64, generated), false, kProblems).append(record(0, "full", 1.0, true));
  expect_error([&] { AccuracyRecordLog(other, header(64), true, kProblems); },
               "budget_base \"generated\", this run has unset");
  // The file is left as it was.
  EXPECT_EQ(read_lines(path).size(), 2u);

  // A data set whose gold answer changed.
  std::vector<Problem> changed = kProblems;
  changed[0].gold = "70";
  expect_error([&] { AccuracyRecordLog(path, header(64), true, changed); }, "records.jsonl:2: problem gsm8k/1");

  // A file that is not a records file, and a broken line before the end.
  {
    std::ofstream out(dir.file("other.jsonl"));
    out << R"({"prompt": "hello"})" << "\n";
  }
  expect_error([&] { AccuracyRecordLog(dir.file("other.jsonl"), header(), true, kProblems); }, "no accuracy_records header");
  {
    std::ofstream out(path, std::ios::app);
    out << "garbage\n" << accuracy_record_json(record(1, "full", 1.0, true), kProblems).dump() << "\n";
  }
  expect_error([&] { AccuracyRecordLog(path, header(64), true, kProblems); }, "records.jsonl:3: not a JSON object");
  // A record missing a field.
  {
    std::ofstream out(dir.file("missing.jsonl"));
    out << header().dump() << "\n" << R"({"id": "gsm8k/1", "gold": "7", "policy": "full"})" << "\n"
        << accuracy_record_json(record(1, "full", 1.0, true), kProblems).dump() << "\n";
  }
  expect_error([&] { AccuracyRecordLog(dir.file("missing.jsonl"), header(), true, kProblems); }, "missing.jsonl:2: bad record");
}

}  // namespace
}  // namespace lazykv::eval
