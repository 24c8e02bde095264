// The multi-turn evaluation and epicache's path through the batched runner,
// on a tiny random model.
#include "eval/conversation.h"

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "eval/policy_grid.h"
#include "tests/unit/temp_dir.h"
#include "tests/unit/eval/tiny_eval_model.h"
#include "worker/model.h"

namespace lazykv::eval {
namespace {

class ConversationTest : public TinyEvalModelTest {
 protected:
  static void SetUpTestSuite() { load("conversation_test", 1024); }  // chats of a few hundred byte tokens

  // Byte tokens: the tiny model has no template the test needs.
  static ConversationEncoder encoder() {
    return {[](const std::vector<ChatMessage>& messages) {
              std::string text;
              for (const ChatMessage& m : messages) text += m.role + ": " + m.content + "\n";
              return tokenizer_->encode(text + "assistant:", false);
            },
            [](const std::string& text) { return tokenizer_->encode(text, false); }};
  }
  static Job epicache_job(int32_t history, int32_t question, int32_t budget, int32_t block, int32_t max_new) {
    Job job;
    for (int32_t i = 0; i < history + question; ++i) job.prompt.push_back(3 + (7 * i + 11) % 250);
    job.policy = make_policy_config("epicache", {{"budget", std::to_string(budget)}, {"block", std::to_string(block)}});
    job.episode = std::make_shared<const EpisodePrompt>(EpisodePrompt{{40, 41, 42, 43, 44}, history});
    job.max_new_tokens = max_new;
    job.ban_eos = true;
    return job;
  }
};

const char* kChat =
    R"({"id": "c0", "turns": [{"role": "user", "content": "apples oranges pears fruit"}, )"
    R"({"role": "assistant", "content": "fruit basket of apples. The answer is 3."}, )"
    R"({"role": "user", "content": "trains stations railway"}, {"role": "assistant", "content": "railway trains. The answer is 7."}, )"
    R"({"role": "user", "content": "apples fruit orchard"}, {"role": "assistant", "content": "apples orchard. The answer is 5."}, )"
    R"({"role": "user", "content": "railway stations timetable"}, {"role": "assistant", "content": "trains timetable. The answer is 9."}], )"
    R"("questions": [{"question": "What about the railway stations?", "answer": "7", "turn": 2}, )"
    R"({"question": "And the apples fruit?", "answer": "3", "turn": 0}]})";

std::string write_file(const TempDir& dir, const std::string& text) {
  const std::string path = (dir.path / "chats.jsonl").string();
  std::ofstream(path) << text;
  return path;
}

std::optional<ErrorCode> load_error(const std::string& path) {
  try {
    load_conversations(path);
  } catch (const Error& e) {
    return e.code();
  }
  return std::nullopt;
}

TEST_F(ConversationTest, LoadsConversationsAndRefusesMalformedOnes) {
  TempDir dir;
  const std::vector<Conversation> chats = load_conversations(write_file(dir, std::string(kChat) + "\n\n"));
  ASSERT_EQ(chats.size(), 1u);
  EXPECT_EQ(chats[0].turns.size(), 8u);
  EXPECT_EQ(chats[0].turns[1].role, "assistant");
  ASSERT_EQ(chats[0].questions.size(), 2u);
  EXPECT_EQ(chats[0].questions[0].gold, "7");
  EXPECT_EQ(chats[0].questions[0].turn, 2);

  EXPECT_EQ(load_error((dir.path / "missing.jsonl").string()), ErrorCode::kNotFound);
  for (const std::string& bad : std::vector<std::string>{"{not json", "[1, 2]",
                                R"({"id": "x", "turns": [{"role": "assistant", "content": "a"}], "questions": [{"question": "q", "answer": "1", "turn": 0}]})",
                                R"({"id": "x", "turns": [{"role": "user", "content": "a"}], "questions": [{"question": "q", "answer": "1", "turn": 1}]})",
                                R"({"id": "x", "turns": [{"role": "user", "content": "a"}], "questions": []})", ""}) {
    EXPECT_EQ(load_error(write_file(dir, bad)), ErrorCode::kInvalidArgument) << bad;
  }
}

TEST_F(ConversationTest, EpisodesHoldMedoidSegmentsAndQuestionsRouteByTopic) {
  TempDir dir;
  const Conversation chat = load_conversations(write_file(dir, kChat))[0];
  EpisodeSetup setup;
  setup.clustering.episodes = 2;
  setup.clustering.medoids = 2;
  const ConversationEpisodes episodes = conversation_episodes(chat, setup);
  ASSERT_EQ(episodes.segments.size(), 4u);  // two turns each
  EXPECT_EQ(episodes.segments[1], (std::pair<int32_t, int32_t>{2, 4}));
  ASSERT_EQ(episodes.patched.size(), 2u);
  for (size_t q = 0; q < chat.questions.size(); ++q) {
    const int e = route(episodes.clusters, episodes.embedder.embed(chat.questions[q].question));
    const std::vector<int>& members = episodes.clusters.members[size_t(e)];
    const int asked = chat.questions[q].turn / 2;  // its segment
    EXPECT_NE(std::find(members.begin(), members.end(), asked), members.end()) << chat.questions[q].question;
    EXPECT_NE(episodes.patched[size_t(e)].find(chat.turns[size_t(chat.questions[q].turn)].content), std::string::npos);
  }
}

// History of 40 in blocks of 16, budget 8: 16 -> 8, 8 + 16 = 24 -> 8,
// 8 + 8 = 16 -> 8; then the question (6) and 4 decode tokens stay.
TEST_F(ConversationTest, EpicacheCompressesTheHistoryBlockByBlock) {
  BatchRunner r = runner(2);
  const std::vector<JobResult> results = r.run({epicache_job(40, 6, 8, 16, 5)});
  ASSERT_TRUE(results[0].ok()) << results[0].error;
  EXPECT_EQ(results[0].tokens.size(), 5u);
  const int64_t heads = int64_t(model_->config().n_layer) * model_->config().n_head_kv;
  EXPECT_EQ(results[0].peak_slots, 24 * heads);
  EXPECT_EQ(results[0].evicted_slots, (8 + 16 + 8) * heads);
}

// Within budget nothing is evicted and no draft runs: the history fed in
// blocks gives the tokens one pass gives.
TEST_F(ConversationTest, BlocksWithinBudgetAnswerAsOnePass) {
  Job blocked = epicache_job(40, 6, 64, 7, 6);
  Job whole = blocked;
  whole.policy = PolicyConfig{};
  whole.episode = nullptr;
  BatchRunner r = runner(2);
  const std::vector<JobResult> results = r.run({blocked, whole});
  ASSERT_TRUE(results[0].ok()) << results[0].error;
  EXPECT_EQ(results[0].tokens, results[1].tokens);
  EXPECT_EQ(results[0].evicted_slots, 0);
}

TEST_F(ConversationTest, EpicacheWithoutAnEpisodeIsRefused) {
  Job job = epicache_job(40, 6, 8, 16, 3);
  job.episode = nullptr;
  BatchRunner r = runner(1);
  const std::vector<JobResult> results = r.run({job});
  EXPECT_EQ(results[0].finish, "error");
  EXPECT_NE(results[0].error.find("no episode"), std::string::npos) << results[0].error;
}

TEST_F(ConversationTest, RunsEveryConfigurationOnEveryQuestion) {
  TempDir dir;
  const std::vector<Conversation> chats = load_conversations(write_file(dir, kChat));
  ConversationOptions options;
  options.policies = {"epicache(block=32)", "snapkv"};
  options.budgets = {0.3, 0.6};
  options.max_tokens = 3;
  options.episodes.clustering.episodes = 2;
  BatchRunner r = runner(4);
  const ConversationReport report = run_conversations(r, chats, encoder(), options);
  ASSERT_EQ(report.rows.size(), 5u);  // full, then 2 policies x 2 budgets
  EXPECT_EQ(report.rows[0].policy, "full");
  EXPECT_EQ(report.rows[1].policy, "epicache(block=32)");
  EXPECT_EQ(report.rows[2].budget_ratio, 0.6);
  EXPECT_EQ(report.questions, 2);
  EXPECT_EQ(report.routed_to_turn, 2);
  ASSERT_EQ(report.records.size(), 10u);
  for (const ConversationRow& row : report.rows) {
    EXPECT_EQ(row.n, 2) << row.policy;
    EXPECT_EQ(row.errors, 0) << row.policy;
  }
  const ConversationRecord& epi = report.records[1];
  EXPECT_EQ(epi.id, "c0#0");
  EXPECT_GT(epi.history_tokens, 100);
  EXPECT_EQ(epi.budget_slots, budget_slots(0.3, epi.history_tokens));
  EXPECT_LT(epi.peak_kv_bytes, report.records[0].peak_kv_bytes);  // below full KV
  const nlohmann::json j = conversation_json(report, "tiny", options, chats.size(), 1.0);
  EXPECT_EQ(j["results"].size(), 5u);
  EXPECT_EQ(j["episodes"]["routed_to_asked_turn"], 2);
  EXPECT_EQ(conversation_record_json(epi)["policy"], "epicache(block=32)");
}

}  // namespace
}  // namespace lazykv::eval
