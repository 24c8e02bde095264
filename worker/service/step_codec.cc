#include "worker/service/step_codec.h"

#include <algorithm>
#include <cstdio>

namespace lazykv::rpc {

void to_proto(const PolicyConfig& in, pb::PolicyConfig* out) {
  out->set_name(in.name);
  auto& params = *out->mutable_params();
  for (const auto& [name, value] : in.params) params[name] = value;
}

void to_proto(const SamplingParams& in, pb::SamplingParams* out) {
  out->set_temperature(in.temperature);
  out->set_top_k(in.top_k);
  out->set_top_p(in.top_p);
  out->set_min_p(in.min_p);
  out->set_seed(in.seed);
  out->set_presence_penalty(in.presence_penalty);
  out->set_frequency_penalty(in.frequency_penalty);
  out->set_repetition_penalty(in.repetition_penalty);
  for (const auto& [token, bias] : in.logit_bias) {
    auto* entry = out->add_logit_bias();
    entry->set_token(token);
    entry->set_bias(bias);
  }
  out->set_min_tokens(in.min_tokens);
  out->mutable_end_tokens()->Add(in.end_tokens.begin(), in.end_tokens.end());
}

void to_proto(const SequenceStart& in, pb::SequenceStart* out) {
  out->set_seq(in.seq);
  out->mutable_prompt()->Add(in.prompt.begin(), in.prompt.end());
  to_proto(in.policy, out->mutable_policy());
  to_proto(in.sampling, out->mutable_sampling());
  out->set_top_logprobs(in.top_logprobs);
  out->set_generated(in.generated);
  out->set_chunks_carry_mask(in.chunks_carry_mask);
}

void to_proto(const StepItem& in, pb::StepItem* out) {
  out->set_seq(in.seq);
  out->set_prefill_tokens(in.prefill_tokens);
  out->mutable_allowed()->Add(in.allowed.begin(), in.allowed.end());
}

void to_proto(const StepPlan& in, pb::StepPlan* out) {
  out->mutable_release()->Add(in.release.begin(), in.release.end());
  for (const SequenceStart& s : in.start) to_proto(s, out->add_start());
  for (const StepItem& it : in.items) to_proto(it, out->add_items());
}

void to_proto(const SampledToken& in, pb::SampledToken* out) {
  out->set_seq(in.seq);
  out->set_token(in.token);
  out->set_logprob(in.logprob);
  for (const auto& [token, logprob] : in.top) {
    pb::TokenLogprob* t = out->add_top();
    t->set_token(token);
    t->set_logprob(logprob);
  }
  out->set_evicted_slots(in.evicted_slots);
  out->set_cached_tokens(in.cached_tokens);
}

void to_proto(const StepResult& in, pb::StepResult* out) {
  out->set_out_of_memory(in.out_of_memory);
  for (const SampledToken& t : in.tokens) to_proto(t, out->add_tokens());
  for (const auto& [seq, reason] : in.failed) {
    pb::SequenceFailure* f = out->add_failed();
    f->set_seq(seq);
    f->set_reason(reason);
    f->set_invalid_request(std::find(in.invalid.begin(), in.invalid.end(), seq) != in.invalid.end());
  }
  out->set_seconds(in.seconds);
  out->set_batch_tokens(in.batch_tokens);
  out->set_evicted_slots(in.evicted_slots);
  out->set_demoted_slots(in.demoted_slots);
  out->set_promoted_slots(in.promoted_slots);
  out->set_promotion_hits(in.promotion_hits);
  out->set_kv_slots(in.kv_slots);
  out->set_kv_bytes(uint64_t(in.kv_bytes));
  out->set_kv_pool_bytes(uint64_t(in.kv_pool_bytes));
  out->set_prefix_cache_bytes(uint64_t(in.prefix_cache_bytes));
  out->set_prefix_fetched_bytes(uint64_t(in.prefix_fetched_bytes));
  out->set_prefix_fetch_seconds(in.prefix_fetch_seconds);
}

void to_proto(const WorkerInfo& in, pb::WorkerInfo* out) {
  out->set_n_ctx(in.n_ctx);
  out->set_n_vocab(in.n_vocab);
  out->set_kv_capacity_bytes(uint64_t(in.kv_capacity_bytes));
  out->set_kv_bytes_per_token(uint64_t(in.kv_bytes_per_token));
  out->set_kv_page_bytes(uint64_t(in.kv_page_bytes));
  out->set_page_slots(in.page_slots);
  out->set_n_layer(in.n_layer);
  out->set_n_head_kv(in.n_head_kv);
  out->set_n_group(in.n_group);
  out->set_rank(in.rank);
  out->set_world(in.world);
  for (const auto& [name, why] : in.unavailable_policies) (*out->mutable_unavailable_policies())[name] = why;
  out->set_prefix_cache(in.prefix_cache);
}

PolicyConfig from_proto(const pb::PolicyConfig& in) {
  PolicyConfig out;
  out.name = in.name();
  for (const auto& [name, value] : in.params()) out.params[name] = value;
  return out;
}

SamplingParams from_proto(const pb::SamplingParams& in) {
  SamplingParams out;
  out.temperature = in.temperature();
  out.top_k = in.top_k();
  out.top_p = in.top_p();
  out.min_p = in.min_p();
  out.seed = in.seed();
  out.presence_penalty = in.presence_penalty();
  out.frequency_penalty = in.frequency_penalty();
  // proto3's 0 is "not sent" (a coordinator from before the field): off. A
  // penalty must be > 0, so 0 means nothing else.
  out.repetition_penalty = in.repetition_penalty() == 0.0f ? 1.0f : in.repetition_penalty();
  for (const auto& entry : in.logit_bias()) out.logit_bias.emplace_back(entry.token(), entry.bias());
  out.min_tokens = in.min_tokens();
  out.end_tokens.assign(in.end_tokens().begin(), in.end_tokens().end());
  return out;
}

SequenceStart from_proto(const pb::SequenceStart& in) {
  SequenceStart out;
  out.seq = in.seq();
  out.prompt.assign(in.prompt().begin(), in.prompt().end());
  out.policy = from_proto(in.policy());
  out.sampling = from_proto(in.sampling());
  out.top_logprobs = in.top_logprobs();
  out.generated = in.generated();
  out.chunks_carry_mask = in.chunks_carry_mask();
  return out;
}

StepItem from_proto(const pb::StepItem& in) {
  return StepItem{in.seq(), in.prefill_tokens(), {in.allowed().begin(), in.allowed().end()}};
}

StepPlan from_proto(const pb::StepPlan& in) {
  StepPlan out;
  out.release.assign(in.release().begin(), in.release().end());
  out.start.reserve(size_t(in.start_size()));
  for (const pb::SequenceStart& s : in.start()) out.start.push_back(from_proto(s));
  out.items.reserve(size_t(in.items_size()));
  for (const pb::StepItem& it : in.items()) out.items.push_back(from_proto(it));
  return out;
}

SampledToken from_proto(const pb::SampledToken& in) {
  SampledToken out;
  out.seq = in.seq();
  out.token = in.token();
  out.logprob = in.logprob();
  out.top.reserve(size_t(in.top_size()));
  for (const pb::TokenLogprob& t : in.top()) out.top.emplace_back(t.token(), t.logprob());
  out.evicted_slots = in.evicted_slots();
  out.cached_tokens = in.cached_tokens();
  return out;
}

StepResult from_proto(const pb::StepResult& in) {
  StepResult out;
  out.out_of_memory = in.out_of_memory();
  out.tokens.reserve(size_t(in.tokens_size()));
  for (const pb::SampledToken& t : in.tokens()) out.tokens.push_back(from_proto(t));
  for (const pb::SequenceFailure& f : in.failed()) {
    out.failed.emplace_back(f.seq(), f.reason());
    if (f.invalid_request()) out.invalid.push_back(f.seq());
  }
  out.seconds = in.seconds();
  out.batch_tokens = in.batch_tokens();
  out.evicted_slots = in.evicted_slots();
  out.demoted_slots = in.demoted_slots();
  out.promoted_slots = in.promoted_slots();
  out.promotion_hits = in.promotion_hits();
  out.kv_slots = in.kv_slots();
  out.kv_bytes = size_t(in.kv_bytes());
  out.kv_pool_bytes = size_t(in.kv_pool_bytes());
  out.prefix_cache_bytes = size_t(in.prefix_cache_bytes());
  out.prefix_fetched_bytes = size_t(in.prefix_fetched_bytes());
  out.prefix_fetch_seconds = in.prefix_fetch_seconds();
  return out;
}

WorkerInfo from_proto(const pb::WorkerInfo& in) {
  WorkerInfo out;
  out.n_ctx = in.n_ctx();
  out.n_vocab = in.n_vocab();
  out.kv_capacity_bytes = size_t(in.kv_capacity_bytes());
  out.kv_bytes_per_token = size_t(in.kv_bytes_per_token());
  out.kv_page_bytes = size_t(in.kv_page_bytes());
  out.page_slots = in.page_slots();
  out.n_layer = in.n_layer();
  out.n_head_kv = in.n_head_kv();
  out.n_group = in.n_group();
  out.rank = in.rank();
  out.world = std::max(in.world(), 1);  // absent (an older worker): no group
  for (const auto& [name, why] : in.unavailable_policies()) out.unavailable_policies[name] = why;
  out.prefix_cache = in.prefix_cache();
  return out;
}

PolicyConfig validate_policy(const PolicyConfig& config) {
  std::map<std::string, std::string> params;
  for (const auto& [name, value] : config.params) {
    char text[64];
    std::snprintf(text, sizeof text, "%.17g", value);  // round-trips every double
    params[name] = text;
  }
  return make_policy_config(config.name, params);
}

}  // namespace lazykv::rpc
