// lazykv eval fidelity | accuracy | conversation: the policy evaluation harness (eval/).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "cli/commands.h"
#include "common/error.h"
#include "common/flags.h"
#include "common/model_registry.h"
#include "coordinator/server/prompt_encoder.h"
#include "eval/accuracy.h"
#include "eval/accuracy_records.h"
#include "eval/conversation.h"
#include "eval/datasets.h"
#include "eval/fidelity.h"
#include "eval/plot.h"
#include "eval/policy_grid.h"

namespace lazykv {
namespace {

constexpr const char* kEvalUsage =
    "usage: lazykv eval <fidelity|accuracy|conversation> [flags]\n"
    "  fidelity  teacher-force a full-KV greedy continuation through each policy and budget;\n"
    "            top-1 agreement and KL divergence against full KV, decode speed (JSON + PNG)\n"
    "  accuracy  answer GSM8K or MATH-500 problems with full KV and each policy and budget (JSON + PNG)\n"
    "  conversation  answer questions about earlier turns of long chats with full KV and each policy and\n"
    "            budget, epicache's episodes included (JSON + PNG)\n"
    "run 'lazykv eval <fidelity|accuracy|conversation> --help' for the flags\n";

void add_common_flags(Flags& flags, const std::string& output, bool data_dir = true) {
  flags.add("model", "default", "model: a .gguf file, a Hugging Face directory, or 'default'");
  if (data_dir) flags.add("data-dir", "", "data set directory (default: $LAZYKV_DATA_DIR, else shared/datasets)");
  flags.add("batch", "16", "sequences run at once (continuous batching)")
      .add("threads", "0", "CPU threads; 0 is all cores")
      .add("activations", "f32", "matmul activation precision: f32 (exact) or int8 (llama.cpp-style, faster batches)")
      .add("output", output, "result JSON file")
      .add("plot", "", "plot PNG file (default: the output path with .png)");
}

std::string data_dir(const Flags& flags) {
  return flags.get("data-dir").empty() ? eval::default_data_dir() : flags.get("data-dir");
}

eval::BatchRunner make_runner(const LoadedModel& m, const Flags& flags) {
  eval::BatchRunnerOptions options;
  options.batch = int(flags.get_int("batch"));
  options.threads = int(flags.get_int("threads"));
  options.precision = parse_activations(flags.get("activations"));
  if (options.batch < 1) throw Error(ErrorCode::kInvalidArgument, "--batch must be >= 1");
  return eval::BatchRunner(*m.model, *m.tokenizer, options);
}

void log_line(const std::string& line) { std::fprintf(stderr, "[eval] %s\n", line.c_str()); }

// Writes the JSON, then the plot; a plotting failure is reported after the JSON is safe.
int write_outputs(const nlohmann::json& result, const Flags& flags) {
  const std::string output = flags.get("output");
  {
    std::ofstream out(output);
    if (!out) throw Error(ErrorCode::kInvalidArgument, "cannot write --output " + output);
    out << result.dump(2) << "\n";
    if (!out) throw Error(ErrorCode::kInternal, "writing " + output + " failed");
  }
  std::fprintf(stderr, "[eval] wrote %s\n", output.c_str());
  const std::string plot =
      flags.get("plot").empty() ? std::filesystem::path(output).replace_extension(".png").string() : flags.get("plot");
  try {
    eval::run_plot(output, plot);
  } catch (const Error& e) {
    std::fprintf(stderr, "lazykv eval: error: %s (the results are in %s)\n", e.what(), output.c_str());
    return 1;
  }
  std::fprintf(stderr, "[eval] wrote %s\n", plot.c_str());
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int run_fidelity(const std::vector<std::string>& args) {
  const auto start = std::chrono::steady_clock::now();
  Flags flags("eval fidelity");
  add_tier_flags(flags);
  add_common_flags(flags, "eval_fidelity.json");
  flags.add("prompts", "", "JSONL file of {\"prompt\": ...} (default: GSM8K questions with the CoT instruction)")
      .add("n-prompts", "4", "GSM8K questions to use when --prompts is not given")
      .add("length", "2048", "reference continuation length in tokens")
      .add("policies", "lazy,streaming,h2o,tova,snapkv,rkv,raas,caote,obcache",
           "policies to compare with full KV; name(param=value,...) sets parameters, e.g. h2o(recent=32)")
      .add("budgets", "0.1,0.2,0.3,0.5", "KV budgets: < 1 a ratio of --length, >= 1 slots")
      .add("speed-steps", "512", "decode steps of the unbatched speed run per configuration (0: none)");
  flags.parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  configure_tiers_from_flags(flags);
  eval::FidelityOptions options;
  options.length = int32_t(flags.get_int("length"));
  options.policies = eval::parse_policies(flags.get("policies"));
  options.budgets = eval::parse_budgets(flags.get("budgets"));
  options.speed_steps = int32_t(flags.get_int("speed-steps"));
  if (options.length < 1) throw Error(ErrorCode::kInvalidArgument, "--length must be >= 1");
  if (options.speed_steps < 0) throw Error(ErrorCode::kInvalidArgument, "--speed-steps must be >= 0");
  std::vector<std::string> messages;
  if (!flags.get("prompts").empty()) {
    messages = eval::load_prompts(flags.get("prompts"));
  } else {
    const int64_t n = flags.get_int("n-prompts");
    if (n < 1) throw Error(ErrorCode::kInvalidArgument, "--n-prompts must be >= 1");
    for (const eval::Problem& p : eval::load_dataset(eval::Dataset::kGsm8k, data_dir(flags))) {
      if (int64_t(messages.size()) == n) break;
      messages.push_back(eval::cot_message(p.question));
    }
  }
  if (messages.empty()) throw Error(ErrorCode::kInvalidArgument, "eval fidelity: no prompts");

  LoadedModel m = load_model(flags.get("model"), FilePages::kHuge);
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& text : messages) prompts.push_back(encode_prompt(m, text, /*chat=*/true));
  eval::BatchRunner runner = make_runner(m, flags);
  const eval::FidelityReport report = eval::run_fidelity(runner, prompts, options, log_line);
  for (const eval::FidelityConfigResult& c : report.configs) {
    std::printf("%-60s top1 %.4f  kl %.5f  peak %.2f MiB  %.1f tok/s\n", c.policy.to_string().c_str(),
                c.top1_agreement(), c.mean_kl(), double(c.peak_kv_bytes) / (1 << 20), c.decode_tok_s);
  }
  nlohmann::json result = eval::fidelity_json(report, m.model->config().name, options, prompts.size(), seconds_since(start));
  result["source"] = flags.get("prompts").empty() ? std::string("gsm8k") : flags.get("prompts");
  result["activations"] = flags.get("activations");
  return write_outputs(result, flags);
}

int run_accuracy(const std::vector<std::string>& args) {
  const auto start = std::chrono::steady_clock::now();
  Flags flags("eval accuracy");
  add_tier_flags(flags);
  add_common_flags(flags, "eval_accuracy.json");
  flags.add("dataset", "gsm8k", "data set: gsm8k or math500")
      .add("instruction", "cot",
           "after each problem: 'cot' (reason step by step) or 'check' (reason step by step, then check the work: "
           "longer traces)")
      .add("limit", "0", "problems to use; 0 is all")
      .add("offset", "0", "first problem")
      .add("policies", "all",
           "policies to compare with full KV ('all': every evicting policy but epicache); name(param=value,...) "
           "sets parameters")
      .add("budgets", "0.3,0.5,0.7",
           "KV budgets: < 1 a ratio of each problem's full-KV length, >= 1 slots (with --budget-base generated: "
           "slots on top of the prompt)")
      .add("budget-base", "total",
           "what a budget ratio is of: 'total' (prompt + full-KV answer) or 'generated' (the full-KV answer; the "
           "prompt is kept, on top of it)")
      .add("match", "budget",
           "what is equal across policies at one budget: 'budget' (C, slots after compaction), 'mean' or 'peak' "
           "(KV slots per head over the answer; C chosen per policy)")
      .add_switch("answer-text", "keep each answer's text in its --records line (traces for lazykv steer)")
      .add("loop-window", "0",
           "stop an answer whose last N tokens repeat a block of at most N/4 tokens (finish \"loop\"); 0: never "
           "(256 suits long reasoning)")
      .add("max-tokens", "1024", "maximum tokens generated per problem")
      .add("records", "", "also write one JSON line per (configuration, problem) to this file, as each job ends")
      .add_switch("resume", "go on from the --records file of an earlier run of the same settings: reuse its records");
  flags.parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  configure_tiers_from_flags(flags);
  eval::AccuracyOptions options;
  options.dataset = eval::parse_dataset(flags.get("dataset"));
  options.instruction = eval::parse_instruction(flags.get("instruction"));
  options.policies = eval::parse_policies(flags.get("policies"));
  options.budgets = eval::parse_budgets(flags.get("budgets"));
  options.max_tokens = int32_t(flags.get_int("max-tokens"));
  if (options.max_tokens < 1) throw Error(ErrorCode::kInvalidArgument, "--max-tokens must be >= 1");
  options.budget_base = eval::parse_budget_base(flags.get("budget-base"));
  options.match = eval::parse_budget_match(flags.get("match"));
  const int64_t loop_window = flags.get_int("loop-window");
  if (loop_window != 0 && (loop_window < 8 || loop_window > (1 << 20))) {
    throw Error(ErrorCode::kInvalidArgument, "--loop-window must be 0 or in [8, 1048576]");
  }
  options.loop_window = int32_t(loop_window);
  options.answer_text = flags.get_bool("answer-text");
  const int64_t limit = flags.get_int("limit"), offset = flags.get_int("offset");
  if (limit < 0 || offset < 0) throw Error(ErrorCode::kInvalidArgument, "--limit and --offset must be >= 0");
  std::vector<eval::Problem> all = eval::load_dataset(options.dataset, data_dir(flags));
  if (offset >= int64_t(all.size())) {
    throw Error(ErrorCode::kInvalidArgument, "--offset " + std::to_string(offset) + " is past the " +
                                                 std::to_string(all.size()) + " problems of the data set");
  }
  const int64_t end = limit == 0 ? int64_t(all.size()) : std::min<int64_t>(int64_t(all.size()), offset + limit);
  const std::vector<eval::Problem> problems(all.begin() + offset, all.begin() + end);

  if (flags.get_bool("resume") && flags.get("records").empty()) {
    throw Error(ErrorCode::kInvalidArgument, "--resume needs the --records file of the run to go on from");
  }

  LoadedModel m = load_model(flags.get("model"), FilePages::kHuge);
  std::vector<std::vector<int32_t>> prompts;
  for (const eval::Problem& p : problems) {
    prompts.push_back(encode_prompt(m, eval::cot_message(p.question, options.instruction), true));
  }
  std::optional<eval::AccuracyRecordLog> records;
  eval::AccuracyResume resume;
  if (!flags.get("records").empty()) {
    records.emplace(flags.get("records"),
                    eval::accuracy_records_header(m.model->config().name, resolve_model_path(flags.get("model")),
                                                  options, flags.get("activations")),
                    flags.get_bool("resume"), problems);
    resume.done = records->resumed();
    resume.on_record = [&records](const eval::AccuracyRecord& r) { records->append(r); };
    if (flags.get_bool("resume")) {
      log_line("resuming from " + flags.get("records") + ": " + std::to_string(resume.done.size()) +
               " records of these problems" + (records->dropped_torn_line() ? " (a torn last line dropped)" : ""));
    }
  }
  eval::BatchRunner runner = make_runner(m, flags);
  const eval::AccuracyReport report = eval::run_accuracy(runner, problems, prompts, options, log_line, resume);
  for (const eval::AccuracyRow& row : report.rows) {
    std::printf(
        "%-10s budget %-6g accuracy %.4f (%lld/%lld)  mean tokens %.1f  KV mean %.2f / peak %.2f MiB  "
        "at the limit %lld, loops %lld\n",
        row.policy.c_str(), row.budget_ratio, row.accuracy(), static_cast<long long>(row.correct),
        static_cast<long long>(row.n), row.mean_generated_tokens, row.mean_kv_bytes / (1 << 20),
        row.mean_peak_kv_bytes / (1 << 20), static_cast<long long>(row.at_length), static_cast<long long>(row.loops));
  }
  nlohmann::json result =
      eval::accuracy_json(report, m.model->config().name, options, problems.size(), seconds_since(start));
  result["activations"] = flags.get("activations");
  result["resumed_records"] = resume.done.size();
  return write_outputs(result, flags);
}

int run_conversation(const std::vector<std::string>& args) {
  const auto start = std::chrono::steady_clock::now();
  Flags flags("eval conversation");
  add_common_flags(flags, "eval_conversation.json", /*data_dir=*/false);
  flags.add("conversations", eval::default_conversations_path(),
            "multi-turn QA set (JSONL, scripts/make_conversations.py)")
      .add("limit", "0", "conversations to use; 0 is all")
      .add("policies", "epicache,lazy,snapkv",
           "policies to compare with full KV; name(param=value,...) sets parameters")
      .add("budgets", "0.1,0.2,0.3", "KV budgets: < 1 a ratio of each conversation's history tokens, >= 1 slots")
      .add("max-tokens", "24", "maximum tokens per answer")
      .add("segment-turns", "2", "turns per segment the history is clustered by (epicache)")
      .add("episodes", "4", "episodes per conversation (epicache's K-means K)")
      .add("medoids", "2", "segments in an episode's patched prompt")
      .add("seed", "42", "K-means seed")
      .add("records", "", "also write one JSON line per (configuration, question) to this file (eval/paired.py)");
  flags.parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  eval::ConversationOptions options;
  options.policies = eval::parse_policies(flags.get("policies"), /*episodic=*/true);
  options.budgets = eval::parse_budgets(flags.get("budgets"));
  options.max_tokens = int32_t(flags.get_int("max-tokens"));
  options.episodes.segment_turns = int(flags.get_int("segment-turns"));
  options.episodes.clustering.episodes = int(flags.get_int("episodes"));
  options.episodes.clustering.medoids = int(flags.get_int("medoids"));
  options.episodes.clustering.seed = uint64_t(flags.get_int("seed"));
  for (const char* flag : {"segment-turns", "episodes", "medoids"}) {
    if (flags.get_int(flag) < 1 || flags.get_int(flag) > 1024) {
      throw Error(ErrorCode::kInvalidArgument, std::string("--") + flag + " must be in [1, 1024]");
    }
  }
  if (options.max_tokens < 1) throw Error(ErrorCode::kInvalidArgument, "--max-tokens must be >= 1");
  std::vector<eval::Conversation> conversations = eval::load_conversations(flags.get("conversations"));
  const int64_t limit = flags.get_int("limit");
  if (limit < 0) throw Error(ErrorCode::kInvalidArgument, "--limit must be >= 0");
  if (limit > 0 && limit < int64_t(conversations.size())) conversations.resize(size_t(limit));

  LoadedModel m = load_model(flags.get("model"), FilePages::kHuge);
  const PromptEncoder encoder(*m.tokenizer);
  if (!encoder.has_chat_template()) {
    throw Error(ErrorCode::kInvalidArgument, "eval conversation: the model has no chat template");
  }
  const eval::ConversationEncoder encode{
      [&](const std::vector<ChatMessage>& messages) { return encoder.encode_chat(messages); },
      [&](const std::string& text) { return encoder.encode_text(text); }};
  eval::BatchRunner runner = make_runner(m, flags);
  const eval::ConversationReport report = eval::run_conversations(runner, conversations, encode, options, log_line);
  for (const eval::ConversationRow& row : report.rows) {
    std::printf("%-10s budget %-6g accuracy %.4f (%lld/%lld)  KV mean %.2f / peak %.2f MiB\n", row.policy.c_str(),
                row.budget_ratio, row.accuracy(), static_cast<long long>(row.correct), static_cast<long long>(row.n),
                row.mean_kv_bytes / (1 << 20), row.mean_peak_kv_bytes / (1 << 20));
  }
  if (!flags.get("records").empty()) {
    std::ofstream out(flags.get("records"));
    for (const eval::ConversationRecord& r : report.records) out << eval::conversation_record_json(r).dump() << "\n";
    if (!out) throw Error(ErrorCode::kInvalidArgument, "cannot write --records " + flags.get("records"));
  }
  return write_outputs(eval::conversation_json(report, m.model->config().name, options, conversations.size(),
                                               seconds_since(start)),
                       flags);
}

}  // namespace

int run_eval(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    std::fputs(kEvalUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "fidelity") return run_fidelity(rest);
  if (args[0] == "accuracy") return run_accuracy(rest);
  if (args[0] == "conversation") return run_conversation(rest);
  throw Error(ErrorCode::kInvalidArgument,
              "unknown eval command '" + args[0] + "'; valid: fidelity, accuracy, conversation");
}

}  // namespace lazykv
