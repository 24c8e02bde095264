#include "eval/conversation.h"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "common/error.h"
#include "eval/answers.h"
#include "eval/datasets.h"
#include "eval/policy_grid.h"

#ifndef LAZYKV_SOURCE_DIR
#define LAZYKV_SOURCE_DIR "."
#endif

namespace lazykv::eval {
namespace {

// What the patched prompt asks of the model before its segments.
constexpr const char* kPatchedInstruction =
    "Extract the essential information from these parts of the conversation: each problem, the numbers it gives, "
    "and its final answer.";

ChatMessage parse_turn(const nlohmann::json& turn, size_t index, const std::string& where) {
  const std::string expected = index % 2 == 0 ? "user" : "assistant";
  if (!turn.is_object() || !turn.contains("role") || !turn.contains("content") || !turn["role"].is_string() ||
      !turn["content"].is_string() || turn["role"] != expected) {
    throw Error(ErrorCode::kInvalidArgument, where + ": turn " + std::to_string(index) +
                                                 " must be {\"role\": \"" + expected + "\", \"content\": string}");
  }
  return {expected, turn["content"].get<std::string>()};
}

Conversation parse_conversation(const nlohmann::json& object, const std::string& where) {
  if (!object.is_object() || !object.contains("id") || !object["id"].is_string() || !object.contains("turns") ||
      !object["turns"].is_array() || object["turns"].empty() || !object.contains("questions") ||
      !object["questions"].is_array() || object["questions"].empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                where + ": a conversation is {\"id\": string, \"turns\": [...], \"questions\": [...]}, none empty");
  }
  if (object["turns"].size() % 2 != 0) {
    throw Error(ErrorCode::kInvalidArgument, where + ": the turns must end with the assistant's (a question follows)");
  }
  Conversation c;
  c.id = object["id"].get<std::string>();
  for (size_t i = 0; i < object["turns"].size(); ++i) c.turns.push_back(parse_turn(object["turns"][i], i, where));
  for (const nlohmann::json& q : object["questions"]) {
    if (!q.is_object() || !q.contains("question") || !q["question"].is_string() || !q.contains("answer") ||
        !q["answer"].is_string() || !q.contains("turn") || !q["turn"].is_number_integer() || q["turn"] < 0 ||
        q["turn"] >= int64_t(c.turns.size())) {
      throw Error(ErrorCode::kInvalidArgument,
                  where + ": a question is {\"question\": string, \"answer\": string, \"turn\": a turn's index}");
    }
    c.questions.push_back({q["question"].get<std::string>(), q["answer"].get<std::string>(), q["turn"].get<int32_t>()});
  }
  return c;
}

// The tokens the two encodings share from the start.
int32_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return int32_t(ia - a.begin());
}

// One question as its jobs ask it: where it is, and where it was routed.
struct AskedQuestion {
  size_t conversation = 0, question = 0, config = 0;  // config: its index in conversation_configs
  int32_t history_tokens = 0;
  int episode = -1;
  bool holds_turn = false;
};

}  // namespace

std::string default_conversations_path() {
  return (std::filesystem::path(LAZYKV_SOURCE_DIR) / "data" / "conversation" / "gsm8k_chats.jsonl").string();
}

std::vector<Conversation> load_conversations(const std::string& path) {
  std::vector<Conversation> out;
  read_jsonl(path, "conversation file", [&](const nlohmann::json& object, int64_t line) {
    out.push_back(parse_conversation(object, path + ":" + std::to_string(line)));
  });
  if (out.empty()) throw Error(ErrorCode::kInvalidArgument, path + " holds no conversation");
  return out;
}

ConversationEpisodes conversation_episodes(const Conversation& conversation, const EpisodeSetup& setup) {
  if (setup.segment_turns < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "eval::conversation_episodes: segment_turns must be >= 1 (" + std::to_string(setup.segment_turns) +
                    ")");
  }
  std::vector<std::pair<int32_t, int32_t>> segments;
  std::vector<std::string> texts;
  for (int32_t first = 0; first < int32_t(conversation.turns.size()); first += setup.segment_turns) {
    const int32_t last = std::min(first + setup.segment_turns, int32_t(conversation.turns.size()));
    std::string text;
    for (int32_t t = first; t < last; ++t) text += (t > first ? "\n" : "") + conversation.turns[size_t(t)].content;
    segments.emplace_back(first, last);
    texts.push_back(std::move(text));
  }
  ConversationEpisodes out{std::move(segments), {}, {}, TextEmbedder(texts)};
  std::vector<std::vector<float>> embeddings;
  for (const std::string& text : texts) embeddings.push_back(out.embedder.embed(text));
  out.clusters = cluster_episodes(embeddings, setup.clustering);
  for (const std::vector<int>& members : out.clusters.members) {
    std::string patched = kPatchedInstruction;
    for (int s : members) patched += "\n\n" + texts[size_t(s)];
    out.patched.push_back(std::move(patched));
  }
  return out;
}

namespace {

// The configurations every question is answered under: full, then each
// policy at each budget.
std::vector<std::pair<std::string, double>> conversation_configs(const ConversationOptions& options) {
  std::vector<std::pair<std::string, double>> configs = {{"full", 1.0}};
  for (const std::string& spec : options.policies) {
    for (double b : options.budgets) configs.emplace_back(spec, b);
  }
  return configs;
}

// Adds one conversation's jobs, every question under every configuration,
// and what each question was routed to.
void add_conversation_jobs(size_t c, const Conversation& conv, const ConversationEncoder& encoder,
                           const ConversationOptions& options, std::vector<Job>& jobs,
                           std::vector<AskedQuestion>& asked, ConversationReport& report) {
  const ConversationEpisodes episodes = conversation_episodes(conv, options.episodes);
  std::vector<std::vector<int32_t>> patched;
  for (const std::string& text : episodes.patched) patched.push_back(encoder.text(text));
  const std::vector<int32_t> history = encoder.chat(conv.turns);
  for (size_t q = 0; q < conv.questions.size(); ++q) {
    const ConversationQuestion& question = conv.questions[q];
    std::vector<ChatMessage> messages = conv.turns;
    messages.push_back({"user", question.question});
    const std::vector<int32_t> prompt = encoder.chat(messages);
    AskedQuestion info{c, q, 0, std::min(common_prefix(history, prompt), int32_t(prompt.size()) - 1),
                      route(episodes.clusters, episodes.embedder.embed(question.question))};
    const std::vector<int>& members = episodes.clusters.members[size_t(info.episode)];
    info.holds_turn = std::any_of(members.begin(), members.end(), [&](int s) {
      return question.turn >= episodes.segments[size_t(s)].first && question.turn < episodes.segments[size_t(s)].second;
    });
    ++report.questions;
    report.routed_to_turn += info.holds_turn;
    const auto episode =
        std::make_shared<const EpisodePrompt>(EpisodePrompt{patched[size_t(info.episode)], info.history_tokens});
    const std::vector<std::pair<std::string, double>> configs = conversation_configs(options);
    for (info.config = 0; info.config < configs.size(); ++info.config) {
      const auto& [spec, budget] = configs[info.config];
      Job job;
      job.prompt = prompt;
      job.max_new_tokens = options.max_tokens;
      if (spec != "full") {
        job.policy = grid_policy_config(spec, budget_slots(budget, info.history_tokens));
        if (job.policy.name == "epicache") job.episode = episode;
      }
      jobs.push_back(std::move(job));
      asked.push_back(info);
    }
  }
}

}  // namespace

ConversationReport run_conversations(BatchRunner& runner, const std::vector<Conversation>& conversations,
                                     const ConversationEncoder& encoder, const ConversationOptions& options,
                                     const std::function<void(const std::string&)>& log) {
  const std::vector<std::pair<std::string, double>> configs = conversation_configs(options);
  std::vector<Job> jobs;
  std::vector<AskedQuestion> asked;  // per job
  ConversationReport report;
  for (size_t c = 0; c < conversations.size(); ++c) {
    add_conversation_jobs(c, conversations[c], encoder, options, jobs, asked, report);
  }
  const auto on_done = [&](size_t, const JobResult&, size_t done, size_t total) {
    if (log && (done % 50 == 0 || done == total)) {
      log(std::to_string(done) + " of " + std::to_string(total) + " answers");
    }
  };
  const std::vector<JobResult> results = runner.run(jobs, {}, on_done);

  report.rows.resize(configs.size());
  for (size_t i = 0; i < configs.size(); ++i) report.rows[i] = {configs[i].first, configs[i].second};
  for (size_t j = 0; j < jobs.size(); ++j) {
    const AskedQuestion& info = asked[j];
    const ConversationQuestion& question = conversations[info.conversation].questions[info.question];
    const JobResult& result = results[j];
    ConversationRecord r;
    r.id = conversations[info.conversation].id + "#" + std::to_string(info.question);
    r.policy = configs[info.config].first;
    r.budget_ratio = configs[info.config].second;
    r.budget_slots = jobs[j].policy.budget();
    r.history_tokens = info.history_tokens;
    r.episode = info.episode;
    r.episode_holds_turn = info.holds_turn;
    r.finish = result.finish;
    r.error = result.error;
    if (result.ok()) {
      r.prediction = extract_prediction(runner.tokenizer().decode(result.tokens), Dataset::kGsm8k);
      r.correct = answer_correct(r.prediction, question.gold, Dataset::kGsm8k);
    }
    r.peak_kv_bytes = result.peak_kv_bytes;
    r.mean_kv_bytes = result.mean_kv_bytes;
    r.failed_drafts = result.failed_drafts;
    ConversationRow& row = report.rows[info.config];
    ++row.n;
    row.correct += r.correct;
    row.errors += !result.ok();
    row.failed_drafts += result.failed_drafts;
    row.mean_kv_bytes += r.mean_kv_bytes;  // sums until divided below
    row.mean_peak_kv_bytes += double(r.peak_kv_bytes);
    report.records.push_back(std::move(r));
  }
  for (ConversationRow& row : report.rows) {  // means over the answers that ran
    row.mean_kv_bytes /= double(std::max<int64_t>(row.n - row.errors, 1));
    row.mean_peak_kv_bytes /= double(std::max<int64_t>(row.n - row.errors, 1));
  }
  return report;
}

nlohmann::json conversation_record_json(const ConversationRecord& r) {
  nlohmann::json j = {{"id", r.id},
                      {"policy", r.policy},
                      {"budget_ratio", r.budget_ratio},
                      {"budget_slots", r.budget_slots},
                      {"history_tokens", r.history_tokens},
                      {"episode", r.episode},
                      {"episode_holds_turn", r.episode_holds_turn},
                      {"prediction", r.prediction ? nlohmann::json(*r.prediction) : nlohmann::json()},
                      {"correct", r.correct},
                      {"peak_kv_bytes", r.peak_kv_bytes},
                      {"mean_kv_bytes", r.mean_kv_bytes},
                      {"finish", r.finish},
                      {"failed_drafts", r.failed_drafts}};
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

nlohmann::json conversation_json(const ConversationReport& report, const std::string& model_name,
                                 const ConversationOptions& options, size_t n_conversations, double wall_s) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ConversationRow& row : report.rows) {
    rows.push_back({{"policy", row.policy},
                    {"budget_ratio", row.budget_ratio},
                    {"accuracy", row.accuracy()},
                    {"correct", row.correct},
                    {"n", row.n},
                    {"errors", row.errors},
                    {"failed_drafts", row.failed_drafts},
                    {"mean_kv_bytes", row.mean_kv_bytes},
                    {"mean_peak_kv_bytes", row.mean_peak_kv_bytes}});
  }
  const EpisodeSetup& e = options.episodes;
  return {{"kind", "eval_conversation"},  // with eval accuracy's fields, so that eval/plot.py draws it
          {"model", model_name},
          {"dataset", "multi-turn GSM8K chats"},
          {"conversations", n_conversations},
          {"n", report.questions},
          {"budget_base", "history"},
          {"match", "budget"},
          {"max_tokens", options.max_tokens},
          {"episodes",
           {{"segment_turns", e.segment_turns},
            {"episodes", e.clustering.episodes},
            {"medoids", e.clustering.medoids},
            {"embedding", "TF-IDF of words hashed into " + std::to_string(kEmbeddingDims) + " dimensions"},
            {"routed_to_asked_turn", report.routed_to_turn},
            {"routed_to_asked_turn_fraction",
             report.questions ? double(report.routed_to_turn) / double(report.questions) : 0.0}}},
          {"results", rows},
          {"wall_s", wall_s}};
}

}  // namespace lazykv::eval
