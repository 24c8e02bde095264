// The HTTP API of the coordinator: OpenAI's /v1/completions,
// /v1/chat/completions (whole or streamed as server-sent events) and
// /v1/models, vLLM's /tokenize and /detokenize, plus /health, /ready and
// /metrics. It validates, applies the
// chat template, tokenizes, queues the sequences on the scheduler and turns
// their events into responses. A client that goes away cancels its sequences.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/log_limiter.h"
#include "common/metrics/registry.h"
#include "coordinator/api/openai_request.h"
#include "coordinator/api/openai_response.h"
#include "coordinator/chat/tool_call_parser.h"
#include "coordinator/http/http_server.h"
#include "coordinator/scheduler/sequence_queue.h"
#include "coordinator/server/prompt_encoder.h"
#include "coordinator/server/service_config.h"

namespace lazykv {

class OpenAiService {
 public:
  OpenAiService(const Tokenizer& tokenizer, SequenceQueue& scheduler, metrics::Registry& metrics, ServiceConfig config);

  // The http::Handler.
  void handle(const http::Request& request, http::ResponseWriter& out);
  // The http::HeaderCheck: a request without a valid API key is answered 401
  // from its header, before its body is read.
  std::optional<http::EarlyAnswer> check_header(const http::Request& head);
  // Counts an answer the HTTP server gave itself (400, 408, 413, 431, 503).
  void count_server_answer(int status) { count("http", status); }

  // /ready answers 200 only while ready (model loaded, not draining).
  void set_ready(bool ready) { ready_ = ready; }
  // Requests being answered now (generation endpoints).
  int in_flight() const { return in_flight_.load(); }

 private:
  // A generation request parsed, checked and queued: what its answer needs.
  struct Admitted {
    api::GenerationRequest request;
    std::vector<SequenceHandle> handles;
    KeyLimiter::Slot slot;
    std::vector<std::string> prompt_texts;  // completions: for echo
    bool prompt_opens_block = false;        // chat: the template opened the thinking block
    ToolCallFormat tool_format = ToolCallFormat::kNone;  // chat with tools offered: how calls are read back
    std::string forced_call;  // tool_choice required or a function: the reply's opening, written by the prompt
  };
  void generate(api::Endpoint endpoint, const http::Request& request, http::ResponseWriter& out);
  // Parses, checks and submits; answers the error itself and returns nullopt.
  std::optional<Admitted> admit(api::Endpoint endpoint, const http::Request& request, std::chrono::steady_clock::time_point arrival,
                                http::ResponseWriter& out);
  // tool_choice: the call format, and for a required call its opening and grammar.
  void apply_tool_choice(Admitted& a) const;
  // One sequence per prompt and choice; the prompts as echo repeats them.
  std::vector<SequenceRequest> build_sequences(Admitted& a, std::chrono::steady_clock::time_point arrival) const;
  void tokenize(const http::Request& request, http::ResponseWriter& out);
  void detokenize(const http::Request& request, http::ResponseWriter& out);
  api::ModelCard model_card() const;
  void send_error(http::ResponseWriter& out, const api::ApiError& error, const std::string& endpoint,
                  const http::Headers& extra = {});
  void count(const std::string& endpoint, int status);
  // Throws ApiError(401) without a valid key; returns the key ("" when keys are off).
  std::string authenticate(const http::Request& request) const;
  void log_ignored_fields(const std::vector<std::string>& fields);

  const Tokenizer& tokenizer_;
  PromptEncoder prompts_;
  std::shared_ptr<grammar::ConstraintCache> constraints_;
  SequenceQueue& scheduler_;
  metrics::Registry& metrics_;
  ServiceConfig config_;
  ReasoningFormat reasoning_;  // config_.reasoning, or what the chat template implies
  std::atomic<bool> ready_{true};
  std::atomic<int> in_flight_{0};
  std::mutex mutex_;
  std::set<std::string> logged_fields_;  // names already logged, at most 256
  LogLimiter field_log_{"unknown request field", 20, std::chrono::minutes(1)};
};

}  // namespace lazykv
