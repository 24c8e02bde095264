#include "eval/accuracy_records.h"

#include <cstdio>
#include <filesystem>
#include <sstream>
#include <unordered_map>

#include "common/error.h"

namespace lazykv::eval {
namespace {

Error bad_line(const std::string& path, size_t line, const std::string& why) {
  return Error(ErrorCode::kInvalidArgument, path + ":" + std::to_string(line) + ": " + why);
}

// The record on a line, its problem given as an index into the run's problems.
AccuracyRecord record_from_json(const nlohmann::json& j, size_t problem) {
  AccuracyRecord r;
  r.problem = problem;
  r.policy = j.at("policy").get<std::string>();
  r.budget_ratio = j.at("budget_ratio").get<double>();
  r.budget_slots = j.at("budget_slots").get<int32_t>();
  if (!j.at("prediction").is_null()) r.prediction = j.at("prediction").get<std::string>();
  r.correct = j.at("correct").get<bool>();
  r.generated_tokens = j.at("generated_tokens").get<int64_t>();
  r.peak_kv_bytes = j.at("peak_kv_bytes").get<int64_t>();
  r.mean_kv_bytes = j.value("mean_kv_bytes", 0.0);  // absent from records written before it was kept
  r.peak_slots_per_head = j.value("peak_slots_per_head", int64_t(0));
  r.mean_slots_per_head = j.value("mean_slots_per_head", 0.0);
  if (j.contains("tiers")) {
    const nlohmann::json& t = j.at("tiers");
    r.tiers.tiers_available = t.at("available").get<bool>();
    r.tiers.demoted_slots = t.at("demoted_slots").get<int64_t>();
    r.tiers.demoted_bytes = t.at("bytes_demoted").get<int64_t>();
    r.tiers.promoted_slots = t.at("promoted_slots").get<int64_t>();
    r.tiers.promoted_bytes = t.at("bytes_promoted").get<int64_t>();
    r.tiers.promotion_hits = t.at("promotion_hits").get<int64_t>();
    r.tiers.fetched_blocks = t.at("fetched_blocks").get<int64_t>();
    r.tiers.fetched_bytes = t.at("bytes_fetched").get<int64_t>();
    r.tiers.fetch_waits = t.at("fetch_waits").get<int64_t>();
  } else if (tiered_spec(r.policy)) {
    r.tiers.tiers_available = false;  // written before records kept what the tiers moved: unknown
  }
  r.finish = j.at("finish").get<std::string>();
  if (j.contains("error")) r.error = j.at("error").get<std::string>();
  if (j.contains("text")) r.text = j.at("text").get<std::string>();
  return r;
}

}  // namespace

nlohmann::json accuracy_records_header(const std::string& model, const std::string& model_path,
                                       const AccuracyOptions& options, const std::string& activations) {
  namespace fs = std::filesystem;
  // A GGUF file's size, or a Hugging Face directory's files' total.
  uintmax_t bytes = 0;
  std::error_code ec;
  if (fs::is_directory(model_path, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(model_path, ec)) {
      if (e.is_regular_file(ec)) bytes += e.file_size(ec);
    }
  } else {
    bytes = fs::file_size(model_path, ec);
    if (ec) bytes = 0;
  }
  nlohmann::json header = {{"kind", "accuracy_records"},
                           {"model", model},
                           {"model_file", fs::path(model_path).filename().string()},
                           {"model_bytes", bytes},
                           {"dataset", dataset_name(options.dataset)},
                           {"max_tokens", options.max_tokens},
                           {"activations", activations}};
  // Settings added later are named only when they differ from what every
  // earlier run used, so that those runs' files still resume.
  if (options.instruction != Instruction::kCot) header["instruction"] = instruction_name(options.instruction);
  if (options.budget_base != BudgetBase::kTotal) header["budget_base"] = budget_base_name(options.budget_base);
  if (options.match != BudgetMatch::kBudget) header["match"] = budget_match_name(options.match);
  if (options.loop_window != 0) header["loop_window"] = options.loop_window;
  return header;
}

nlohmann::json accuracy_record_json(const AccuracyRecord& record, const std::vector<Problem>& problems) {
  const Problem& p = problems[record.problem];
  nlohmann::json j = {{"id", p.id},
                      {"policy", record.policy},
                      {"budget_ratio", record.budget_ratio},
                      {"budget_slots", record.budget_slots},
                      {"gold", p.gold},
                      {"prediction", record.prediction ? nlohmann::json(*record.prediction) : nlohmann::json(nullptr)},
                      {"correct", record.correct},
                      {"generated_tokens", record.generated_tokens},
                      {"peak_kv_bytes", record.peak_kv_bytes},
                      {"mean_kv_bytes", record.mean_kv_bytes},
                      {"peak_slots_per_head", record.peak_slots_per_head},
                      {"mean_slots_per_head", record.mean_slots_per_head},
                      {"finish", record.finish}};
  if (tiered_spec(record.policy)) j["tiers"] = tier_counters_json(record.tiers, double(record.generated_tokens));
  if (!record.error.empty()) j["error"] = record.error;
  if (record.text) j["text"] = *record.text;
  return j;
}

AccuracyRecordLog::AccuracyRecordLog(const std::string& path, const nlohmann::json& header, bool resume,
                                     const std::vector<Problem>& problems)
    : path_(path), problems_(problems) {
  std::vector<std::string> kept;  // record lines to write back, as they were
  if (resume && std::filesystem::exists(path)) {
    std::ifstream in(path);
    if (!in) throw Error(ErrorCode::kInvalidArgument, "cannot read --records " + path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    while (!lines.empty() && lines.back().empty()) lines.pop_back();
    std::unordered_map<std::string, size_t> index_of;
    for (size_t i = 0; i < problems.size(); ++i) index_of.emplace(problems[i].id, i);
    for (size_t n = 0; n < lines.size(); ++n) {
      nlohmann::json j = nlohmann::json::parse(lines[n], nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) {
        if (n + 1 == lines.size() && n > 0) {  // the write a killed run left unfinished
          dropped_torn_line_ = true;
          break;
        }
        throw bad_line(path, n + 1, "not a JSON object");
      }
      if (n == 0) {
        if (j.value("kind", "") != "accuracy_records") {
          throw bad_line(path, 1, "not a records file of lazykv eval accuracy (no accuracy_records header)");
        }
        // Both ways: a setting only one of the two headers names differs too.
        nlohmann::json fields = header;
        fields.update(j);
        for (const auto& item : fields.items()) {
          const std::string& field = item.key();  // (a structured binding: clang cannot capture it)
          const auto named = [&](const nlohmann::json& h) {
            return h.contains(field) ? h[field].dump() : std::string("unset");
          };
          if (named(j) != named(header)) {
            throw Error(ErrorCode::kInvalidArgument, "--resume: " + path + " was written with " + field + " " +
                                                         named(j) + ", this run has " + named(header) +
                                                         "; give another --records file or the same settings");
          }
        }
        continue;
      }
      try {
        const std::string id = j.at("id").get<std::string>();
        const auto it = index_of.find(id);
        if (it != index_of.end()) {
          if (j.at("gold").get<std::string>() != problems[it->second].gold) {
            throw bad_line(path, n + 1, "problem " + id + " has gold answer " + j.at("gold").dump() +
                                            " but the data set says \"" + problems[it->second].gold + "\"");
          }
          resumed_.push_back(record_from_json(j, it->second));
        }
      } catch (const nlohmann::json::exception& e) {
        throw bad_line(path, n + 1, std::string("bad record: ") + e.what());
      }
      kept.push_back(lines[n]);
    }
  }
  // Write the header and the kept records to a temporary file, then put it in place.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw Error(ErrorCode::kInvalidArgument, "cannot write --records " + path);
    out << header.dump() << "\n";
    for (const std::string& line : kept) out << line << "\n";
    if (!out.flush()) throw Error(ErrorCode::kInternal, "writing " + tmp + " failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(ErrorCode::kInternal, "cannot move " + tmp + " to " + path + ": " + ec.message());
  out_.open(path, std::ios::app);
  if (!out_) throw Error(ErrorCode::kInvalidArgument, "cannot append to --records " + path);
}

void AccuracyRecordLog::append(const AccuracyRecord& record) {
  out_ << accuracy_record_json(record, problems_).dump() << "\n";
  if (!out_.flush()) throw Error(ErrorCode::kInternal, "writing --records " + path_ + " failed");
}

}  // namespace lazykv::eval
