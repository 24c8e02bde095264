// OpenAI-compatible request bodies: /v1/completions and /v1/chat/completions
// parsed and validated into one GenerationRequest. Every rejection is an
// ApiError carrying the HTTP status, OpenAI's error type, the offending
// parameter and a message a user can act on; nothing is half-parsed.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/policy_config.h"
#include "coordinator/chat/chat_template.h"
#include "coordinator/grammar/json_schema.h"

namespace lazykv::api {

// An error as OpenAI reports it: {"error": {"message", "type", "param", "code"}}.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, std::string message, std::string param = "", std::string code = "")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;        // 400, 401, 404, 413, 429, 500, 503, ...
  std::string type;  // "invalid_request_error", "authentication_error", "not_found_error", "server_error", ...
  std::string param; // the request field at fault, or ""
  std::string code;  // a machine-readable code ("context_length_exceeded", "model_not_found", ...), or ""
};

// A 400 invalid_request_error about `param`.
ApiError invalid_request(std::string message, std::string param = "", std::string code = "");

enum class Endpoint { kCompletions, kChatCompletions };

// One prompt of a completions request: text, or token ids given directly.
struct Prompt {
  std::string text;
  std::vector<int32_t> tokens;
  bool is_tokens = false;
};

// What the server enforces while parsing (0: no limit).
struct RequestLimits {
  int32_t max_tokens_cap = 0;  // largest max_tokens accepted
  int max_n = 16;              // largest n
  int max_prompts = 16;        // largest batch of prompts in one completions request
  int max_stop = 4;            // stop strings (OpenAI allows 4)
};

// Whether and which tool the reply calls (chat).
struct ToolChoice {
  enum class Mode { kNone, kAuto, kRequired, kFunction };
  Mode mode = Mode::kNone;  // OpenAI's default: kAuto when tools are given
  std::string function;     // kFunction: its name, one of the tools
};

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                   // required, non-empty
  std::vector<Prompt> prompts;         // completions: >= 1 (a string, strings, ids, or lists of ids)
  std::vector<ChatMessage> messages;   // chat: >= 1; content given as a string or as text parts
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // chat: function tools as given, validated
  ToolChoice tool_choice;
  std::optional<int32_t> max_tokens;   // max_tokens (chat also max_completion_tokens); unset: up to the context
  float temperature = 1.0f;            // [0, 2]
  float top_p = 1.0f;                  // (0, 1]
  int top_k = 0;                       // extension, >= 0 (0: off)
  float min_p = 0.0f;                  // extension, [0, 1]
  bool ignore_eos = false;             // extension (as vLLM and llama.cpp): run on past end-of-generation to max_tokens
  float presence_penalty = 0.0f;       // [-2, 2]
  float frequency_penalty = 0.0f;      // [-2, 2]
  float repetition_penalty = 1.0f;     // extension (as vLLM), [0.01, 100]; 1: off
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias in [-100, 100]), at most 1024
  int32_t min_tokens = 0;              // extension (as vLLM): no end-of-generation token before this many
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;       // a string or an array of strings; empty strings dropped
  int n = 1;                           // choices per prompt, [1, limits.max_n]
  bool stream = false;
  bool include_usage = false;          // stream_options.include_usage (only with stream)
  // Log-probabilities. Completions: "logprobs": k (0..5) sets logprobs with
  // top_logprobs = k. Chat: "logprobs": true plus "top_logprobs": 0..20.
  bool logprobs = false;
  int top_logprobs = 0;
  bool echo = false;                   // completions: the prompt text is prepended to each choice
  std::optional<PolicyConfig> kv_policy;  // extension "kv_policy": {"name": ..., params...}; unset: server default
  // Structured output: response_format json_object or json_schema, or the
  // extensions guided_json (a schema) and guided_choice (one of some
  // strings), compiled. No schema: free text.
  grammar::ResponseGrammar response_grammar;
  std::string user;
  // Top-level fields lazykv does not know, in order of appearance: ignored,
  // so newer clients keep working; the server logs each name once. At most
  // 16, each cut to 64 bytes with control characters escaped (printable()).
  std::vector<std::string> ignored_fields;
};

// Parse and validate a request body for `endpoint`. Throws ApiError (status
// 400) for malformed JSON, a body that is not an object, invalid UTF-8 in any
// string, missing or mistyped fields, values out of range, empty prompts or
// messages, min_tokens above max_tokens, and features lazykv does not
// implement when they would change the output (echo together with logprobs,
// best_of != n, functions, a JSON schema with a keyword lazykv cannot
// enforce, ignore_eos or min_tokens together with a structured output). Unknown
// fields are not errors: they are listed in ignored_fields.
GenerationRequest parse_generation_request(Endpoint endpoint, std::string_view body, const RequestLimits& limits);

// vLLM's POST /tokenize: a prompt (as /v1/completions encodes it) or chat
// messages (rendered with the chat template for a reply). Unknown fields are
// ignored.
struct TokenizeRequest {
  std::string model;                  // optional; when given, it must be the served model
  std::optional<std::string> prompt;  // exactly one of prompt and messages
  std::vector<ChatMessage> messages;
  bool add_special_tokens = true;     // prompt: BOS where the model asks for it
  bool return_token_strs = false;     // also each token's text
};
TokenizeRequest parse_tokenize_request(std::string_view body);

// vLLM's POST /detokenize: token ids back to text.
struct DetokenizeRequest {
  std::string model;  // optional, as in TokenizeRequest
  std::vector<int32_t> tokens;
};
DetokenizeRequest parse_detokenize_request(std::string_view body);

// For callers that hold a request's numbers as numbers rather than JSON
// text (gRPC, whose floats may be NaN or infinite where JSON has none):
// throws the ApiError parse_generation_request gives for `value` in `field`
// ("temperature", "top_p", "min_p", the penalties and "logit_bias" (a bias)
// by their ranges; any other field when the value is not finite).
void check_sampling_number(const std::string& field, double value);

}  // namespace lazykv::api
