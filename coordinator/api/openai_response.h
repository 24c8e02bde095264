// OpenAI-compatible response bodies: whole completions, streamed chunks
// (the JSON of one SSE `data:` line), model lists and errors. Text is
// always valid UTF-8 here (the stream decoder guarantees it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/api/openai_request.h"
#include "coordinator/chat/tool_call_stream.h"

namespace lazykv::api {

struct TopLogprob {
  std::string token;  // the token's text (its raw bytes; may be part of a UTF-8 character)
  float logprob = 0;
};

// One generated token's log-probability with the most likely alternatives.
struct TokenLogprob {
  std::string token;
  float logprob = 0;
  std::vector<TopLogprob> top;  // most likely first, request.top_logprobs of them
  int32_t text_offset = 0;      // completions: the token's offset in the choice's text, in code points
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  std::optional<int64_t> reasoning_tokens;  // set: completion_tokens_details.reasoning_tokens
};

struct Choice {
  int index = 0;
  std::string text;               // the generated text (chat: the assistant message content)
  std::optional<std::string> reasoning;  // chat with a reasoning parser: reasoning_content (null when empty)
  std::vector<ToolCall> tool_calls;      // chat: message.tool_calls (content null when empty)
  std::string finish_reason;      // "stop" or "length"
  std::vector<TokenLogprob> logprobs;
  bool has_logprobs = false;      // the request asked for logprobs
};

// Identity of one response: "cmpl-..." or "chatcmpl-...", creation time (unix seconds), model name.
struct ResponseMeta {
  std::string id;
  int64_t created = 0;
  std::string model;
};

// A whole (non-streamed) response body.
std::string completion_body(Endpoint endpoint, const ResponseMeta& meta, const std::vector<Choice>& choices,
                            const Usage& usage);

// One streamed chunk's JSON. Chat: the first chunk of a choice carries
// role "assistant" (first_of_choice); the final one has an empty delta and the
// finish reason. Completions: text plus finish_reason (null until the end).
// With include_usage every chunk has "usage": null.
struct ChunkDelta {
  int index = 0;
  std::string text;
  std::string reasoning;  // chat: delta.reasoning_content when not empty
  std::vector<ToolCallDelta> tool_calls;  // chat: delta.tool_calls, pieces of calls (whole ones are one piece)
  bool first_of_choice = false;
  std::optional<std::string> finish_reason;
  std::vector<TokenLogprob> logprobs;
  bool has_logprobs = false;
};
std::string chunk_body(Endpoint endpoint, const ResponseMeta& meta, const ChunkDelta& delta, bool include_usage);
// The final usage chunk of a stream with include_usage: "choices": [] plus usage.
std::string usage_chunk_body(Endpoint endpoint, const ResponseMeta& meta, const Usage& usage);

struct ModelCard {
  std::string id;
  int32_t max_model_len = 0;  // the context in tokens (vLLM's field)
};
// GET /v1/models.
std::string models_body(const std::vector<ModelCard>& models, int64_t created);
// GET /v1/models/{id}.
std::string model_body(const ModelCard& model, int64_t created);
// POST /tokenize (vLLM's): {"count", "max_model_len", "tokens", "token_strs"};
// token_strs null unless asked for. Strings must be valid UTF-8 (repaired by the caller).
std::string tokenize_body(const std::vector<int32_t>& tokens, int32_t max_model_len,
                          const std::vector<std::string>* token_strs);
// POST /detokenize (vLLM's): {"prompt": text}.
std::string detokenize_body(const std::string& text);

// {"error": {...}} for an ApiError.
std::string error_body(const ApiError& error);
// The body of an error a server answers without an ApiError at hand (the
// HTTP layer's 413, the router's 502/503): type server_error from 500 up,
// invalid_request_error below.
std::string status_error_body(int status, const std::string& message);

}  // namespace lazykv::api
