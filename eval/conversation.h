// The multi-turn evaluation (lazykv eval conversation): long chats whose
// questions ask about earlier turns (data/conversation/gsm8k_chats.jsonl,
// made by scripts/make_conversations.py), each answered with full KV and
// with every (policy, budget), the budget a ratio of the history's tokens.
// epicache's jobs get their episode here, as EpiCache builds it: the
// history cut into segments of a few turns, the segments clustered
// (eval/episodes.h), each episode's patched prompt made of its medoid
// segments, and each question routed to the episode nearest to it.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/chat/chat_template.h"
#include "eval/batch_runner.h"
#include "eval/episodes.h"

namespace lazykv::eval {

struct ConversationQuestion {
  std::string question;
  std::string gold;  // the number the answer must give
  int32_t turn = 0;  // the turn that holds what it asks about
};

struct Conversation {
  std::string id;
  std::vector<ChatMessage> turns;  // user and assistant, alternating
  std::vector<ConversationQuestion> questions;
};

// data/conversation/gsm8k_chats.jsonl in the source tree.
std::string default_conversations_path();
// Error(kNotFound) naming a missing file; Error(kInvalidArgument) with the
// line for a malformed conversation (fields, roles, a question's turn
// outside the history).
std::vector<Conversation> load_conversations(const std::string& path);

// How the history becomes episodes (EpiCache's offline step).
struct EpisodeSetup {
  int segment_turns = 2;  // turns per segment: one question and its answer
  EpisodeOptions clustering;
};

struct ConversationEpisodes {
  std::vector<std::pair<int32_t, int32_t>> segments;  // turn ranges [first, last)
  Episodes clusters;
  std::vector<std::string> patched;  // per episode: the instruction, then its medoid segments in order
  TextEmbedder embedder;
};
ConversationEpisodes conversation_episodes(const Conversation& conversation, const EpisodeSetup& setup);

struct ConversationOptions {
  std::vector<std::string> policies;  // specs, as eval accuracy's
  std::vector<double> budgets;        // ratios (< 1) of each history's tokens, or slots
  int32_t max_tokens = 24;
  EpisodeSetup episodes;
};

// The caller's tokenization (it owns the chat template): a chat rendered
// with the generation prompt, and plain text.
struct ConversationEncoder {
  std::function<std::vector<int32_t>(const std::vector<ChatMessage>&)> chat;
  std::function<std::vector<int32_t>(const std::string&)> text;
};

struct ConversationRecord {
  std::string id;  // "<conversation id>#<question>"
  std::string policy;
  double budget_ratio = 1;
  int32_t budget_slots = 0;  // 0 for full
  int32_t history_tokens = 0;
  int episode = -1;                 // the episode the question was routed to
  bool episode_holds_turn = false;  // ... whose medoids include the asked turn
  std::optional<std::string> prediction;
  bool correct = false;
  int64_t peak_kv_bytes = 0;
  double mean_kv_bytes = 0;
  int64_t failed_drafts = 0;  // epicache compressions whose draft found no room (JobResult::failed_drafts)
  std::string finish, error;
};

struct ConversationRow {
  std::string policy;
  double budget_ratio = 1;
  int64_t correct = 0, n = 0, errors = 0, failed_drafts = 0;
  double mean_kv_bytes = 0, mean_peak_kv_bytes = 0;  // over the answers that ran
  double accuracy() const { return n ? double(correct) / double(n) : 0.0; }
};

struct ConversationReport {
  std::vector<ConversationRow> rows;  // full first, then policies x budgets
  std::vector<ConversationRecord> records;
  int64_t questions = 0, routed_to_turn = 0;  // questions whose episode holds the asked turn
};

ConversationReport run_conversations(BatchRunner& runner, const std::vector<Conversation>& conversations,
                                     const ConversationEncoder& encoder, const ConversationOptions& options,
                                     const std::function<void(const std::string&)>& log = {});

nlohmann::json conversation_json(const ConversationReport& report, const std::string& model_name,
                                 const ConversationOptions& options, size_t n_conversations, double wall_s);
// One JSON line per record, in the fields eval/paired.py reads.
nlohmann::json conversation_record_json(const ConversationRecord& record);

}  // namespace lazykv::eval
