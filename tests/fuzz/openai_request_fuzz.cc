// libFuzzer target: `lazykv serve` parses request bodies from any client.
// The bytes go to parse_generation_request for both endpoints; ApiError is
// the expected failure, anything else (another exception, a crash, a
// sanitizer report, a hang) is a bug. A request that parses is answered with
// the response formatter, so its output path is exercised too.
#include <cstdint>
#include <string>
#include <string_view>

#include "coordinator/api/openai_request.h"
#include "coordinator/api/openai_response.h"

namespace {

using namespace lazykv::api;

// A stand-in for the generated text: the request's own text (prompt or last
// message), cut at an arbitrary byte so that it may end mid-character.
std::string sample_text(const GenerationRequest& r) {
  std::string text;
  if (!r.prompts.empty()) {
    const Prompt& p = r.prompts.front();
    text = p.is_tokens ? std::to_string(p.tokens.size()) + " tokens" : p.text;
  } else if (!r.messages.empty()) {
    text = r.messages.back().content;
  }
  return text.substr(0, 64);
}

void format_response(const GenerationRequest& r) {
  const std::string text = sample_text(r);
  const ResponseMeta meta{"cmpl-fuzz", 1700000000, r.model};
  Choice choice;
  choice.text = text;
  choice.finish_reason = "stop";
  choice.has_logprobs = r.logprobs;
  // One log-probability per byte of the text: single bytes of a multi-byte
  // character are the token pieces the formatter must repair.
  for (size_t i = 0; i < text.size() && r.logprobs; ++i) {
    TokenLogprob lp;
    lp.token = text.substr(i, 1);
    lp.logprob = -float(i);
    lp.text_offset = int32_t(i);
    for (int k = 0; k < r.top_logprobs; ++k) lp.top.push_back({text.substr(i, size_t(k) + 1), -float(k)});
    choice.logprobs.push_back(lp);
  }
  const Usage usage{int64_t(text.size()), int64_t(choice.logprobs.size()), int64_t(text.size() / 2)};
  volatile size_t sink = completion_body(r.endpoint, meta, {choice}, usage).size();

  ChunkDelta delta;
  delta.text = text;
  delta.first_of_choice = true;
  delta.has_logprobs = choice.has_logprobs;
  delta.logprobs = choice.logprobs;
  sink = sink + chunk_body(r.endpoint, meta, delta, r.include_usage).size();
  delta.first_of_choice = false;
  delta.finish_reason = "length";
  sink = sink + chunk_body(r.endpoint, meta, delta, r.include_usage).size();
  sink = sink + usage_chunk_body(r.endpoint, meta, usage).size();
  sink = sink + models_body({{r.model, 4096}}, meta.created).size();
  (void)sink;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  RequestLimits limits;
  limits.max_tokens_cap = 4096;
  for (const Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    try {
      format_response(parse_generation_request(endpoint, body, limits));
    } catch (const ApiError& e) {
      volatile size_t sink = error_body(e).size();
      (void)sink;
    }
  }
  // The tokenize bodies share the parser's helpers (messages, token ids).
  try {
    const TokenizeRequest t = parse_tokenize_request(body);
    const std::vector<std::string> strs(t.messages.size(), t.model);
    volatile size_t sink = tokenize_body({1, 2}, 4096, t.return_token_strs ? &strs : nullptr).size();
    (void)sink;
  } catch (const ApiError& e) {
    volatile size_t sink = error_body(e).size();
    (void)sink;
  }
  try {
    const DetokenizeRequest d = parse_detokenize_request(body);
    volatile size_t sink = tokenize_body(d.tokens, 4096, nullptr).size() + detokenize_body(d.model).size();
    (void)sink;
  } catch (const ApiError& e) {
    volatile size_t sink = error_body(e).size();
    (void)sink;
  }
  return 0;
}
