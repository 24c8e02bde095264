#include "coordinator/grpc/grpc_api.h"

#include <google/protobuf/stubs/logging.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/error.h"
#include "common/log_limiter.h"
#include "common/metrics/metric_names.h"
#include "common/quote.h"
#include "coordinator/api/openai_request.h"
#include "coordinator/grpc/call_accounting.h"
#include "coordinator/server/sequence_builder.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;
// How often a call waiting for tokens checks that its client is still there.
constexpr auto kClientPoll = std::chrono::milliseconds(50);

// An HTTP API error as a gRPC status.
grpc::Status to_status(const api::ApiError& e) {
  switch (e.status) {
    case 401: return {grpc::UNAUTHENTICATED, e.what()};
    case 404: return {grpc::NOT_FOUND, e.what()};
    case 429: return {grpc::RESOURCE_EXHAUSTED, e.what()};
    case 503: return {grpc::UNAVAILABLE, e.what()};
    default: return {e.status >= 500 ? grpc::INTERNAL : grpc::INVALID_ARGUMENT, e.what()};
  }
}

// The request as the body of the equivalent OpenAI request, so that
// api::parse_generation_request validates both APIs by the same rules, with
// the same messages. log-probabilities are read separately (their OpenAI
// forms differ between the two endpoints).
nlohmann::json to_openai_body(const v1::GenerateRequest& q, api::Endpoint& endpoint) {
  nlohmann::json body = nlohmann::json::object();
  body["model"] = q.model();
  endpoint = api::Endpoint::kCompletions;
  switch (q.input_case()) {
    case v1::GenerateRequest::kPrompt:
      body["prompt"] = q.prompt();
      break;
    case v1::GenerateRequest::kPromptTokens:
      if (q.prompt_tokens().ids().empty()) throw api::invalid_request("'prompt_tokens' must not be empty", "prompt");
      body["prompt"] = std::vector<int32_t>(q.prompt_tokens().ids().begin(), q.prompt_tokens().ids().end());
      break;
    case v1::GenerateRequest::kChat: {
      endpoint = api::Endpoint::kChatCompletions;
      nlohmann::json& messages = body["messages"] = nlohmann::json::array();
      for (const v1::ChatMessage& m : q.chat().messages()) {
        messages.push_back({{"role", m.role()}, {"content", m.content()}});
      }
      break;
    }
    case v1::GenerateRequest::INPUT_NOT_SET:
      throw api::invalid_request("one of 'prompt', 'prompt_tokens' or 'chat' is required", "prompt");
  }
  if (q.has_max_tokens()) body["max_tokens"] = q.max_tokens();
  // Checked here: JSON has no NaN or infinity (dump() writes null, which
  // would read as "not set").
  const auto number = [&](const char* field, bool has, float value) {
    if (!has) return;
    api::check_sampling_number(field, value);
    body[field] = value;
  };
  number("temperature", q.has_temperature(), q.temperature());
  number("top_p", q.has_top_p(), q.top_p());
  if (q.has_top_k()) body["top_k"] = q.top_k();
  number("min_p", q.has_min_p(), q.min_p());
  if (q.has_seed()) body["seed"] = q.seed();
  if (!q.stop().empty()) body["stop"] = std::vector<std::string>(q.stop().begin(), q.stop().end());
  if (q.has_n()) body["n"] = q.n();
  if (q.ignore_eos()) body["ignore_eos"] = true;
  number("presence_penalty", q.has_presence_penalty(), q.presence_penalty());
  number("frequency_penalty", q.has_frequency_penalty(), q.frequency_penalty());
  number("repetition_penalty", q.has_repetition_penalty(), q.repetition_penalty());
  if (!q.logit_bias().empty()) {
    nlohmann::json& bias = body["logit_bias"] = nlohmann::json::object();
    for (const auto& [token, value] : q.logit_bias()) {
      api::check_sampling_number("logit_bias", value);
      bias[std::to_string(token)] = value;
    }
  }
  if (q.has_min_tokens()) body["min_tokens"] = q.min_tokens();
  if (q.has_kv_policy() && (!q.kv_policy().name().empty() || !q.kv_policy().params().empty())) {
    nlohmann::json policy = {{"name", q.kv_policy().name()}};
    for (const auto& [name, value] : q.kv_policy().params()) {
      api::check_sampling_number("kv_policy." + name, value);
      policy[name] = value;
    }
    body["kv_policy"] = std::move(policy);
  }
  return body;
}

// protobuf logs one line for every message with invalid UTF-8 in a string
// field, which any client can send: at most a few a minute reach the log.
void limited_protobuf_log(google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
  static LogLimiter limiter("protobuf", 10, std::chrono::minutes(1));
  static constexpr const char* kLevels[] = {"INFO", "WARNING", "ERROR", "FATAL"};
  const int index = std::clamp(int(level), 0, 3);
  limiter.write(std::string("[libprotobuf ") + kLevels[index] + " " + file + ":" + std::to_string(line) + "] " +
                printable(message, 1024));
}

void limit_protobuf_log() {
  static std::once_flag once;
  std::call_once(once, [] { google::protobuf::SetLogHandler(&limited_protobuf_log); });
}

// Holds Generate's in-flight count for the call's lifetime.
struct InFlight {
  explicit InFlight(std::atomic<int>& n) : n_(n) { ++n_; }
  ~InFlight() { --n_; }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  std::atomic<int>& n_;
};

}  // namespace

GrpcApi::GrpcApi(const Tokenizer& tokenizer, SequenceQueue& scheduler, metrics::Registry& metrics, ServiceConfig config)
    : tokenizer_(tokenizer),
      prompts_(tokenizer),
      constraints_(config.constraints ? config.constraints : std::make_shared<grammar::ConstraintCache>(tokenizer)),
      scheduler_(scheduler),
      metrics_(metrics),
      config_(std::move(config)) {
  limit_protobuf_log();
}

GrpcServer::Interceptors GrpcApi::interceptors() {
  GrpcServer::Interceptors list;
  list.push_back(std::make_unique<CallAccountingFactory>(metrics_));
  return list;
}

grpc::Status GrpcApi::authenticate(const grpc::ServerContext& context, std::string* key) const {
  if (config_.api_keys.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  if (it != metadata.end()) {
    if (std::optional<std::string> accepted =
            config_.key_of_authorization(std::string_view(it->second.data(), it->second.size()))) {
      if (key != nullptr) *key = std::move(*accepted);
      return grpc::Status::OK;
    }
  }
  return {grpc::UNAUTHENTICATED, it == metadata.end()
                                     ? "missing API key: send the metadata 'authorization: Bearer <key>'"
                                     : "incorrect API key provided"};
}

grpc::Status GrpcApi::ListModels(grpc::ServerContext* context, const v1::ListModelsRequest*,
                                 v1::ListModelsResponse* response) {
  if (grpc::Status auth = authenticate(*context); !auth.ok()) return auth;
  v1::Model* model = response->add_models();
  model->set_id(config_.model_id);
  model->set_context_length(scheduler_.worker_info().n_ctx);
  model->set_owned_by("lazykv");
  return grpc::Status::OK;
}

grpc::Status GrpcApi::Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                               grpc::ServerWriter<v1::GenerateResponse>* writer) {
  const auto arrival = Clock::now();
  InFlight in_flight(in_flight_);
  std::string key;
  if (grpc::Status auth = authenticate(*context, &key); !auth.ok()) return auth;

  std::vector<SequenceHandle> handles;
  KeyLimiter::Slot slot;
  bool chose_policy = false;  // a policy the worker refuses is then the request's error
  try {
    if (config_.key_limiter) slot = config_.key_limiter->acquire(key);
    api::Endpoint endpoint{};
    const nlohmann::json body = to_openai_body(*request, endpoint);
    const bool chat = endpoint == api::Endpoint::kChatCompletions;
    const api::GenerationRequest r = api::parse_generation_request(endpoint, body.dump(), config_.limits);
    const int top_logprobs = request->has_top_logprobs() ? request->top_logprobs() : -1;
    if (top_logprobs < -1 || top_logprobs > 20) {
      throw api::invalid_request("'top_logprobs' must be between -1 and 20, got " + std::to_string(top_logprobs),
                                 "top_logprobs");
    }
    config_.check_model(r.model);

    api::GenerationRequest with_logprobs = r;
    with_logprobs.logprobs = top_logprobs >= 0;
    with_logprobs.top_logprobs = std::max(top_logprobs, 0);
    const std::vector<int32_t> prompt = encode_request_prompt(prompts_, tokenizer_, r, 0);
    const int32_t max_tokens = resolve_max_tokens(r, int32_t(prompt.size()), scheduler_.worker_info().n_ctx, config_);
    check_kv_policy(r, int32_t(prompt.size()), scheduler_.worker_info(), config_);
    chose_policy = r.kv_policy.has_value();
    const char* input = chat ? "messages" : "prompt";
    std::vector<SequenceRequest> sequences =
        make_sequences(with_logprobs, prompt, max_tokens, config_, 0, arrival, response_constraint(*constraints_, r));
    try {
      handles = scheduler_.submit(std::move(sequences));
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kUnavailable) return {grpc::UNAVAILABLE, e.what()};
      throw api::invalid_request(e.what(), input);
    }
  } catch (const api::ApiError& e) {
    return to_status(e);
  }

  // Stream the sequences' events.
  std::map<uint64_t, uint32_t> index_of;
  for (size_t i = 0; i < handles.size(); ++i) index_of[handles[i].id] = uint32_t(i);
  const std::shared_ptr<SequenceStream> stream = handles.front().stream;
  v1::GenerateResponse::Usage usage;
  size_t n_done = 0;
  std::optional<grpc::Status> failure;
  bool client_gone = false;
  const bool logprobs = request->has_top_logprobs() && request->top_logprobs() >= 0;
  v1::GenerateResponse message;
  while (n_done < handles.size() && !client_gone && !failure) {
    const std::vector<SequenceEvent> events = stream->wait(kClientPoll);
    if (context->IsCancelled()) {
      client_gone = true;
      break;
    }
    for (const SequenceEvent& e : events) {
      const uint32_t index = index_of.at(e.sequence);
      message.Clear();
      if (e.kind == SequenceEvent::Kind::kToken) {
        v1::GenerateResponse::Token* token = message.mutable_token();
        token->set_index(index);
        token->set_text(e.text);
        token->set_token_id(e.token.id);
        if (logprobs) {
          token->set_logprob(e.token.logprob);
          for (const auto& [bytes, lp] : e.token.top) {
            v1::TopLogprob* top = token->add_top_logprobs();
            top->set_token(bytes);
            top->set_logprob(lp);
          }
        }
      } else {
        ++n_done;
        usage.set_completion_tokens(usage.completion_tokens() + e.completion_tokens);
        if (index == 0) usage.set_prompt_tokens(e.prompt_tokens);  // the choices share one prompt
        if (e.finish_reason == "error" || e.finish_reason == "cancelled") {
          if (!failure) {
            failure = grpc::Status(e.unavailable                         ? grpc::UNAVAILABLE
                                   : e.invalid_request && chose_policy ? grpc::INVALID_ARGUMENT
                                                                       : grpc::INTERNAL,
                                   e.error.empty() ? "the sequence was cancelled" : e.error);
          }
          break;
        }
        v1::GenerateResponse::Finish* fin = message.mutable_finish();
        fin->set_index(index);
        fin->set_text(e.text);
        fin->set_finish_reason(e.finish_reason);
        fin->set_completion_tokens(e.completion_tokens);
      }
      if (!writer->Write(message)) {
        client_gone = true;
        break;
      }
    }
  }
  if (client_gone || failure) {
    for (const SequenceHandle& h : handles) scheduler_.cancel(h.id);
  }
  metrics_.histogram(metrics::kRequestDuration).observe(std::chrono::duration<double>(Clock::now() - arrival).count());
  if (client_gone) return {grpc::CANCELLED, "the client cancelled the call"};
  if (failure) return *failure;
  usage.set_total_tokens(usage.prompt_tokens() + usage.completion_tokens());
  message.Clear();
  *message.mutable_usage() = usage;
  if (!writer->Write(message)) {
    return {grpc::CANCELLED, "the client cancelled the call"};
  }
  return grpc::Status::OK;
}

}  // namespace lazykv
