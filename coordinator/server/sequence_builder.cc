#include "coordinator/server/sequence_builder.h"

#include "common/error.h"
#include "common/random.h"

namespace lazykv {

std::vector<int32_t> encode_request_prompt(const PromptEncoder& encoder, const Tokenizer& tokenizer,
                                           const api::GenerationRequest& request, size_t index) {
  const bool chat = request.endpoint == api::Endpoint::kChatCompletions;
  for (const auto& [id, bias] : request.logit_bias) {
    if (id >= tokenizer.n_vocab()) {
      throw api::invalid_request("'logit_bias' names token id " + std::to_string(id) + ", outside the vocabulary of " +
                                     std::to_string(tokenizer.n_vocab()) + " tokens",
                                 "logit_bias");
    }
  }
  try {
    if (chat) {
      // tool_choice "none": the model is not told of the tools (vLLM does so
      // with --exclude-tools-when-tool-choice-none).
      const bool offer_tools = request.tool_choice.mode != api::ToolChoice::Mode::kNone;
      return encoder.encode_chat(request.messages, offer_tools ? request.tools : nlohmann::ordered_json::array());
    }
    const api::Prompt& p = request.prompts.at(index);
    if (!p.is_tokens) return encoder.encode_text(p.text);
    for (int32_t id : p.tokens) {
      if (id < 0 || id >= tokenizer.n_vocab()) {
        throw api::invalid_request("token id " + std::to_string(id) + " is outside the vocabulary of " +
                                       std::to_string(tokenizer.n_vocab()) + " tokens",
                                   "prompt");
      }
    }
    return p.tokens;
  } catch (const Error& e) {
    throw api::invalid_request(e.what(), chat ? "messages" : "prompt");
  }
}

int32_t resolve_max_tokens(const api::GenerationRequest& request, int32_t prompt_len, int32_t n_ctx,
                           const ServiceConfig& config) {
  const bool chat = request.endpoint == api::Endpoint::kChatCompletions;
  int32_t max_tokens = 0;
  if (request.max_tokens) {
    max_tokens = *request.max_tokens;
  } else {
    max_tokens = chat ? n_ctx - prompt_len : std::min(config.completions_default_max_tokens, n_ctx - prompt_len);
    if (config.limits.max_tokens_cap > 0) max_tokens = std::min(max_tokens, config.limits.max_tokens_cap);
  }
  const std::string input = chat ? "messages" : "prompt";
  const std::string limit = "This model's maximum context length is " + std::to_string(n_ctx) + " tokens. ";
  if (prompt_len >= n_ctx) {
    throw api::invalid_request(limit + "However, your " + input + " resulted in " + std::to_string(prompt_len) +
                                   " tokens, which leaves no room for a completion. Please reduce the length of the " +
                                   input + " to fewer than " + std::to_string(n_ctx) + " tokens.",
                               input, "context_length_exceeded");
  }
  if (int64_t(prompt_len) + max_tokens > n_ctx) {
    throw api::invalid_request(limit + "However, you requested " + std::to_string(int64_t(prompt_len) + max_tokens) +
                                   " tokens (" + std::to_string(prompt_len) + " in the " + input + ", " +
                                   std::to_string(max_tokens) + " in the completion); with this " + input +
                                   " at most " + std::to_string(n_ctx - prompt_len) +
                                   " completion tokens fit. Please reduce the length of the " + input +
                                   " or of the completion.",
                               input, "context_length_exceeded");
  }
  if (request.min_tokens > max_tokens) {
    throw api::invalid_request("'min_tokens' (" + std::to_string(request.min_tokens) + ") exceeds the " +
                                   std::to_string(max_tokens) + " completion tokens this request allows",
                               "min_tokens");
  }
  return max_tokens;
}

std::shared_ptr<const grammar::TokenConstraint> response_constraint(grammar::ConstraintCache& cache,
                                                                    const api::GenerationRequest& request) {
  if (!request.response_grammar.schema) return nullptr;
  try {
    return cache.get(request.response_grammar);
  } catch (const Error& e) {
    throw api::invalid_request(e.what(), "response_format");
  }
}

void check_kv_policy(const api::GenerationRequest& request, int32_t prompt_len, const WorkerInfo& info,
                     const ServiceConfig& config) {
  const PolicyConfig& policy = request.kv_policy ? *request.kv_policy : config.default_policy;
  const std::string param = request.kv_policy ? "kv_policy"
                            : request.endpoint == api::Endpoint::kChatCompletions ? "messages"
                                                                                  : "prompt";
  if (const auto it = info.unavailable_policies.find(policy.name); it != info.unavailable_policies.end()) {
    throw api::invalid_request("policy " + policy.name + " cannot run on this model: " + it->second, param);
  }
  if (std::string why = prompt_refusal(policy, prompt_len); !why.empty()) throw api::invalid_request(why, param);
}

std::vector<SequenceRequest> make_sequences(const api::GenerationRequest& request, const std::vector<int32_t>& prompt,
                                            int32_t max_tokens, const ServiceConfig& config, size_t first_choice,
                                            std::chrono::steady_clock::time_point arrival,
                                            std::shared_ptr<const grammar::TokenConstraint> constraint) {
  std::vector<SequenceRequest> sequences;
  for (int j = 0; j < request.n; ++j) {
    SequenceRequest s;
    s.prompt = prompt;
    s.max_new_tokens = max_tokens;
    s.sampling.temperature = request.temperature;
    s.sampling.top_p = request.top_p;
    s.sampling.top_k = request.top_k;
    s.sampling.min_p = request.min_p;
    s.sampling.seed = request.seed ? *request.seed + uint64_t(first_choice + size_t(j)) : random_u64();
    s.sampling.presence_penalty = request.presence_penalty;
    s.sampling.frequency_penalty = request.frequency_penalty;
    s.sampling.repetition_penalty = request.repetition_penalty;
    s.sampling.logit_bias = request.logit_bias;
    s.sampling.min_tokens = request.min_tokens;
    s.policy = request.kv_policy ? *request.kv_policy : config.default_policy;
    s.top_logprobs = request.logprobs ? request.top_logprobs : -1;
    s.stop = request.stop;
    s.ignore_eos = request.ignore_eos;
    s.arrival = arrival;
    s.constraint = constraint;
    sequences.push_back(std::move(s));
  }
  return sequences;
}

}  // namespace lazykv
