// From a validated API request to the scheduler's sequences, one way for
// every API (HTTP and gRPC): the prompt's token ids, max_tokens resolved
// against the context, and one SequenceRequest per choice.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "coordinator/api/openai_request.h"
#include "coordinator/scheduler/scheduler.h"
#include "coordinator/server/prompt_encoder.h"
#include "coordinator/server/service_config.h"

namespace lazykv {

// Token ids of prompt `index` of a completions request, or of the rendered
// messages of a chat request. ApiError 400 (param "prompt" or "messages") for
// a token id outside the vocabulary or a chat template that rejects the
// messages; (param "logit_bias") for a logit_bias token outside the vocabulary.
std::vector<int32_t> encode_request_prompt(const PromptEncoder& encoder, const Tokenizer& tokenizer,
                                           const api::GenerationRequest& request, size_t index);

// The request's max_tokens for a prompt of prompt_len tokens; left out: the
// rest of the context for chat, completions_default_max_tokens otherwise
// (both under limits.max_tokens_cap). ApiError 400 with code
// context_length_exceeded when prompt and completion do not fit n_ctx; 400
// (param "min_tokens") when min_tokens exceeds the result.
int32_t resolve_max_tokens(const api::GenerationRequest& request, int32_t prompt_len, int32_t n_ctx,
                           const ServiceConfig& config);

// Refuses, before any step, a KV policy that cannot run this request: one the
// model lacks what it needs for (info.unavailable_policies) or one that keeps
// a prompt filling its budget (prompt_refusal). ApiError 400 with param
// "kv_policy" when the request named the policy; with the server's default
// policy, param "messages"/"prompt" (only a shorter prompt helps).
void check_kv_policy(const api::GenerationRequest& request, int32_t prompt_len, const WorkerInfo& info,
                     const ServiceConfig& config);

// The token constraint of the request's structured output, or null.
std::shared_ptr<const grammar::TokenConstraint> response_constraint(grammar::ConstraintCache& cache,
                                                                    const api::GenerationRequest& request);

// request.n sequences of `prompt`. Choice c (first_choice + j) samples with
// seed + c when the request has a seed, so choices differ and repeat.
std::vector<SequenceRequest> make_sequences(const api::GenerationRequest& request, const std::vector<int32_t>& prompt,
                                            int32_t max_tokens, const ServiceConfig& config, size_t first_choice,
                                            std::chrono::steady_clock::time_point arrival,
                                            std::shared_ptr<const grammar::TokenConstraint> constraint = nullptr);

}  // namespace lazykv
