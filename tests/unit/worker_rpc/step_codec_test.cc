// The step protocol's codec: every message survives to_proto -> bytes ->
// from_proto unchanged, and policies from the wire are validated.
#include "worker/service/step_codec.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace lazykv {
namespace {

// Through the wire bytes, as the other process sees it.
template <typename Message, typename Value>
auto round_trip(const Value& value) {
  Message message;
  rpc::to_proto(value, &message);
  std::string bytes;
  EXPECT_TRUE(message.SerializeToString(&bytes));
  Message parsed;
  EXPECT_TRUE(parsed.ParseFromString(bytes));
  return rpc::from_proto(parsed);
}

SequenceStart sample_start(SeqId seq) {
  SequenceStart s;
  s.chunks_carry_mask = true;
  s.seq = seq;
  s.prompt = {1, 7, 0, 49151, 3};
  s.policy = make_policy_config("lazy", {{"budget", "96"}, {"window", "16"}, {"alpha", "0.000123"}});
  s.sampling.temperature = 0.7f;
  s.sampling.top_k = 40;
  s.sampling.top_p = 0.9f;
  s.sampling.min_p = 0.05f;
  s.sampling.seed = 0xfedcba9876543210ull;
  s.sampling.presence_penalty = 0.25f;
  s.sampling.frequency_penalty = -1.5f;
  s.sampling.repetition_penalty = 1.1f;
  s.sampling.logit_bias = {{49151, -100.0f}, {0, 2.5f}};
  s.sampling.min_tokens = 12;
  s.sampling.end_tokens = {0, 2};
  s.generated = 2;
  s.top_logprobs = 5;
  return s;
}

void expect_equal(const SequenceStart& a, const SequenceStart& b) {
  EXPECT_EQ(a.seq, b.seq);
  EXPECT_EQ(a.prompt, b.prompt);
  EXPECT_EQ(a.policy.name, b.policy.name);
  EXPECT_EQ(a.policy.params, b.policy.params);
  EXPECT_EQ(a.sampling.temperature, b.sampling.temperature);
  EXPECT_EQ(a.sampling.top_k, b.sampling.top_k);
  EXPECT_EQ(a.sampling.top_p, b.sampling.top_p);
  EXPECT_EQ(a.sampling.min_p, b.sampling.min_p);
  EXPECT_EQ(a.sampling.seed, b.sampling.seed);
  EXPECT_EQ(a.sampling.presence_penalty, b.sampling.presence_penalty);
  EXPECT_EQ(a.sampling.frequency_penalty, b.sampling.frequency_penalty);
  EXPECT_EQ(a.sampling.repetition_penalty, b.sampling.repetition_penalty);
  EXPECT_EQ(a.sampling.logit_bias, b.sampling.logit_bias);
  EXPECT_EQ(a.sampling.min_tokens, b.sampling.min_tokens);
  EXPECT_EQ(a.sampling.end_tokens, b.sampling.end_tokens);
  EXPECT_EQ(a.generated, b.generated);
  EXPECT_EQ(a.top_logprobs, b.top_logprobs);
  EXPECT_EQ(a.chunks_carry_mask, b.chunks_carry_mask);
}

TEST(StepCodec, PolicyAndSamplingRoundTrip) {
  const PolicyConfig policy = make_policy_config("h2o", {{"budget", "64"}, {"recent", "8"}});
  const PolicyConfig back = round_trip<rpc::pb::PolicyConfig>(policy);
  EXPECT_EQ(back.name, "h2o");
  EXPECT_EQ(back.params, policy.params);
  EXPECT_EQ(back.to_string(), policy.to_string());

  SamplingParams sampling;  // the C++ defaults differ from proto3's zero defaults
  const SamplingParams s = round_trip<rpc::pb::SamplingParams>(sampling);
  EXPECT_EQ(s.temperature, 0.0f);
  EXPECT_EQ(s.top_p, 1.0f);
  EXPECT_EQ(s.top_k, 0);
  EXPECT_EQ(s.repetition_penalty, 1.0f);
  EXPECT_FALSE(s.adjusts_logits());
  // A message without the field (proto3 reads 0, as from a coordinator that
  // predates it) is a penalty that is off, not an invalid one.
  rpc::pb::SamplingParams unset;
  unset.set_temperature(0.5f);
  EXPECT_EQ(rpc::from_proto(unset).repetition_penalty, 1.0f);
}

TEST(StepCodec, StepPlanRoundTrip) {
  StepPlan plan;
  plan.release = {3, 9, int64_t(1) << 40};
  plan.start = {sample_start(11), sample_start(12)};
  plan.start[1].top_logprobs = -1;
  plan.start[1].policy = make_policy_config("full");
  plan.items = {{11, 5, {}}, {12, 0, {0x80000001u, 0u, 0xffffffffu}}, {4, 128, {}}};
  const StepPlan back = round_trip<rpc::pb::StepPlan>(plan);
  EXPECT_EQ(back.release, plan.release);
  ASSERT_EQ(back.start.size(), 2u);
  expect_equal(back.start[0], plan.start[0]);
  expect_equal(back.start[1], plan.start[1]);
  ASSERT_EQ(back.items.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back.items[i].seq, plan.items[i].seq);
    EXPECT_EQ(back.items[i].prefill_tokens, plan.items[i].prefill_tokens);
    EXPECT_EQ(back.items[i].allowed, plan.items[i].allowed);
  }
}

TEST(StepCodec, StepResultRoundTrip) {
  StepResult result;
  result.out_of_memory = true;
  SampledToken a;
  a.seq = 5;
  a.token = 42;
  a.logprob = -0.3125f;
  a.top = {{42, -0.3125f}, {7, -1.5f}, {0, -20.25f}};
  a.evicted_slots = int64_t(1) << 36;
  SampledToken b;  // a prefill chunk: no token
  b.seq = 6;
  b.cached_tokens = 1920;  // of a prompt the prefix cache held
  result.tokens = {a, b};
  result.failed = {{8, "the prompt is empty"}, {9, "policy triattention: no query statistics"}};
  result.invalid = {9};
  result.seconds = 0.123456789;
  result.batch_tokens = 77;
  result.evicted_slots = int64_t(1) << 35;
  result.demoted_slots = 17;
  result.promoted_slots = 5;
  result.promotion_hits = 3;
  result.kv_slots = 123456;
  result.kv_bytes = size_t(5) << 33;
  result.kv_pool_bytes = size_t(7) << 33;
  result.prefix_cache_bytes = size_t(3) << 33;
  result.prefix_fetched_bytes = size_t(5) << 31;
  result.prefix_fetch_seconds = 0.125;
  const StepResult back = round_trip<rpc::pb::StepResult>(result);
  EXPECT_TRUE(back.out_of_memory);
  ASSERT_EQ(back.tokens.size(), 2u);
  EXPECT_EQ(back.tokens[0].seq, 5);
  EXPECT_EQ(back.tokens[0].token, 42);
  EXPECT_EQ(back.tokens[0].logprob, -0.3125f);
  EXPECT_EQ(back.tokens[0].top, a.top);
  EXPECT_EQ(back.tokens[0].evicted_slots, a.evicted_slots);
  EXPECT_EQ(back.tokens[1].seq, 6);
  EXPECT_EQ(back.tokens[1].token, -1);
  EXPECT_TRUE(back.tokens[1].top.empty());
  EXPECT_EQ(back.tokens[0].cached_tokens, 0);
  EXPECT_EQ(back.tokens[1].cached_tokens, 1920);
  EXPECT_EQ(back.failed, result.failed);
  EXPECT_EQ(back.invalid, result.invalid);
  EXPECT_EQ(back.seconds, result.seconds);
  EXPECT_EQ(back.batch_tokens, 77);
  EXPECT_EQ(back.evicted_slots, result.evicted_slots);
  EXPECT_EQ(back.demoted_slots, 17);
  EXPECT_EQ(back.promoted_slots, 5);
  EXPECT_EQ(back.promotion_hits, 3);
  EXPECT_EQ(back.kv_slots, result.kv_slots);
  EXPECT_EQ(back.kv_bytes, result.kv_bytes);
  EXPECT_EQ(back.kv_pool_bytes, result.kv_pool_bytes);
  EXPECT_EQ(back.prefix_cache_bytes, result.prefix_cache_bytes);
  EXPECT_EQ(back.prefix_fetched_bytes, result.prefix_fetched_bytes);
  EXPECT_EQ(back.prefix_fetch_seconds, result.prefix_fetch_seconds);
}

TEST(StepCodec, WorkerInfoRoundTrip) {
  WorkerInfo info;
  info.n_ctx = 8192;
  info.n_vocab = 49152;
  info.kv_capacity_bytes = size_t(3) << 32;
  info.kv_bytes_per_token = 92160;
  info.kv_page_bytes = 8192;
  info.page_slots = 64;
  info.n_layer = 30;
  info.n_head_kv = 3;
  info.n_group = 3;
  info.rank = 1;
  info.world = 2;
  info.prefix_cache = true;
  const WorkerInfo back = round_trip<rpc::pb::WorkerInfo>(info);
  EXPECT_EQ(back.n_ctx, info.n_ctx);
  EXPECT_EQ(back.n_vocab, info.n_vocab);
  EXPECT_EQ(back.kv_capacity_bytes, info.kv_capacity_bytes);
  EXPECT_EQ(back.kv_bytes_per_token, info.kv_bytes_per_token);
  EXPECT_EQ(back.kv_page_bytes, info.kv_page_bytes);
  EXPECT_EQ(back.page_slots, info.page_slots);
  EXPECT_EQ(back.n_layer, info.n_layer);
  EXPECT_EQ(back.n_head_kv, info.n_head_kv);
  EXPECT_EQ(back.n_group, info.n_group);
  EXPECT_EQ(back.rank, 1);
  EXPECT_EQ(back.world, 2);
  EXPECT_TRUE(back.prefix_cache);
  // A message without the fields (an older worker) is a group of one.
  EXPECT_EQ(rpc::from_proto(rpc::pb::WorkerInfo()).world, 1);
}

TEST(StepCodec, ValidatePolicyAcceptsWhatMakePolicyConfigMadeAndRejectsTheRest) {
  const PolicyConfig lazy = make_policy_config("lazy", {{"budget", "96"}, {"window", "16"}, {"alpha", "0.000123"}});
  EXPECT_EQ(rpc::validate_policy(lazy).params, lazy.params);

  PolicyConfig bad = lazy;
  bad.params["budget"] = -3;
  EXPECT_THROW(rpc::validate_policy(bad), Error);
  bad = lazy;
  bad.params["window"] = 500;  // not below the budget
  EXPECT_THROW(rpc::validate_policy(bad), Error);
  bad = lazy;
  bad.name = "magic";
  EXPECT_THROW(rpc::validate_policy(bad), Error);
  bad = lazy;
  bad.params["budget"] = 96.5;  // an integer parameter
  EXPECT_THROW(rpc::validate_policy(bad), Error);

  PolicyConfig partial;  // missing parameters get their defaults
  partial.name = "streaming";
  partial.params["budget"] = 64;
  const PolicyConfig filled = rpc::validate_policy(partial);
  EXPECT_EQ(filled.params.count("sinks"), 1u);
}

}  // namespace
}  // namespace lazykv
