#include "coordinator/server/openai_service.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <span>

#include "common/error.h"
#include "common/metrics/metric_names.h"
#include "common/random.h"
#include "common/utf8.h"
#include "coordinator/api/openai_response.h"
#include "coordinator/chat/reply_text.h"
#include "coordinator/server/forced_tool_call.h"
#include "coordinator/server/sequence_builder.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;
// How often a request thread waiting for tokens checks that its client is still there.
constexpr auto kClientPoll = std::chrono::milliseconds(100);

std::string endpoint_name(api::Endpoint endpoint) {
  return endpoint == api::Endpoint::kChatCompletions ? "chat_completions" : "completions";
}

std::string response_id(api::Endpoint endpoint) {
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(random_u64()),
                static_cast<unsigned long long>(random_u64()));
  return (endpoint == api::Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-") + std::string(hex, 24);
}

std::string tool_call_id() {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(random_u64()));
  return "call_" + std::string(hex);
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string sse(const std::string& data) { return "data: " + data + "\n\n"; }

// Gives each call that begins in `pieces` its id (kept in `ids`, by call index).
void name_calls(std::vector<ToolCallDelta>& pieces, std::vector<std::string>& ids) {
  for (ToolCallDelta& p : pieces) {
    if (p.name.empty()) continue;
    if (ids.size() <= size_t(p.index)) ids.resize(size_t(p.index) + 1);
    ids[size_t(p.index)] = tool_call_id();
    p.id = ids[size_t(p.index)];
  }
}

// The metrics `type` of an error status.
std::string error_type(int status) {
  switch (status) {
    case 401: return "authentication";
    case 429: return "rate_limited";
    case 503: return "overloaded";
    default: return status >= 500 ? "internal" : "invalid_request";
  }
}

api::TokenLogprob to_api(const TokenInfo& token, int32_t offset) {
  api::TokenLogprob out;
  out.token = token.bytes;
  out.logprob = token.logprob;
  out.text_offset = offset;
  for (const auto& [bytes, lp] : token.top) out.top.push_back({bytes, lp});
  return out;
}

}  // namespace

OpenAiService::OpenAiService(const Tokenizer& tokenizer, SequenceQueue& scheduler, metrics::Registry& metrics,
                             ServiceConfig config)
    : tokenizer_(tokenizer),
      prompts_(tokenizer),
      constraints_(config.constraints ? config.constraints : std::make_shared<grammar::ConstraintCache>(tokenizer)),
      scheduler_(scheduler),
      metrics_(metrics),
      config_(std::move(config)),
      reasoning_(config_.reasoning.value_or(reasoning_format_of_template(tokenizer.spec().chat_template))) {
  metrics_.gauge(metrics::kBuildInfo, {config_.version, config_.model_id}).set(1);
}

void OpenAiService::count(const std::string& endpoint, int status) {
  metrics_.counter(metrics::kRequests, {endpoint, std::to_string(status)}).inc();
  if (status >= 400 && status != 499) metrics_.counter(metrics::kErrors, {error_type(status)}).inc();
}

void OpenAiService::send_error(http::ResponseWriter& out, const api::ApiError& error, const std::string& endpoint,
                               const http::Headers& extra) {
  count(endpoint, error.status);
  http::Headers headers = extra;
  if (error.status == 401) headers.emplace_back("WWW-Authenticate", "Bearer");  // RFC 6750: the scheme it asks for
  out.send(error.status, "application/json", api::error_body(error), headers);
}

std::string OpenAiService::authenticate(const http::Request& request) const {
  const std::string_view auth = request.header("authorization");
  if (std::optional<std::string> key = config_.key_of_authorization(auth)) return std::move(*key);
  // OpenAI's own 401 body: an invalid_request_error with code invalid_api_key.
  throw api::ApiError(401, "invalid_request_error",
                      auth.empty() ? "missing API key: send the header 'Authorization: Bearer <key>'"
                                   : "incorrect API key provided",
                      "", "invalid_api_key");
}

std::optional<http::EarlyAnswer> OpenAiService::check_header(const http::Request& head) {
  const std::string& path = head.path;
  std::string endpoint;
  if (path == "/v1/completions") {
    endpoint = endpoint_name(api::Endpoint::kCompletions);
  } else if (path == "/v1/chat/completions") {
    endpoint = endpoint_name(api::Endpoint::kChatCompletions);
  } else if (path == "/v1/models" || path.starts_with("/v1/models/")) {
    endpoint = "models";
  } else if (path == "/tokenize" || path == "/detokenize") {
    endpoint = path.substr(1);  // vLLM leaves them open; they render templates and tokenize, so they take the key
  } else {
    return std::nullopt;  // no key needed, or an unknown URL (404 from handle())
  }
  try {
    authenticate(head);
    return std::nullopt;
  } catch (const api::ApiError& e) {
    count(endpoint, e.status);
    return http::EarlyAnswer{e.status, api::error_body(e), {{"WWW-Authenticate", "Bearer"}}};
  }
}

void OpenAiService::log_ignored_fields(const std::vector<std::string>& fields) {
  // The names are short and printable already (parse_generation_request).
  std::lock_guard lock(mutex_);
  for (const std::string& f : fields) {
    if (logged_fields_.size() < 256 && logged_fields_.insert(f).second) {
      field_log_.write("lazykv serve: ignoring the unknown request field '" + f + "' (logged once)");
    }
  }
}

void OpenAiService::handle(const http::Request& request, http::ResponseWriter& out) {
  const std::string& path = request.path;
  const bool get = request.method == "GET" || request.method == "HEAD";
  const auto method_not_allowed = [&](const std::string& endpoint, const char* allowed) {
    send_error(out, api::ApiError(405, "invalid_request_error",
                                  "method " + request.method + " is not allowed on " + path + " (use " + allowed + ")"),
               endpoint, {{"Allow", allowed}});
  };
  try {
    if (path == "/health") {
      if (!get) return method_not_allowed("health", "GET");
      count("health", 200);
      out.send(200, "application/json", R"({"status":"ok"})");
    } else if (path == "/ready") {
      if (!get) return method_not_allowed("ready", "GET");
      const bool ready = ready_ && !scheduler_.draining();
      count("ready", ready ? 200 : 503);
      out.send(ready ? 200 : 503, "application/json", ready ? R"({"status":"ready"})" : R"({"status":"not ready"})");
    } else if (path == "/metrics") {
      if (!get) return method_not_allowed("metrics", "GET");
      count("metrics", 200);
      out.send(200, metrics::Registry::kContentType, metrics_.render());
    } else if (path == "/v1/models" || path.starts_with("/v1/models/")) {
      if (!get) return method_not_allowed("models", "GET");
      authenticate(request);
      if (path == "/v1/models") {
        count("models", 200);
        out.send(200, "application/json", api::models_body({model_card()}, unix_now()));
        return;
      }
      config_.check_model(path.substr(std::string("/v1/models/").size()));
      count("models", 200);
      out.send(200, "application/json", api::model_body(model_card(), unix_now()));
    } else if (path == "/tokenize" || path == "/detokenize") {
      if (request.method != "POST") return method_not_allowed(path.substr(1), "POST");
      authenticate(request);
      path == "/tokenize" ? tokenize(request, out) : detokenize(request, out);
    } else if (path == "/v1/completions" || path == "/v1/chat/completions") {
      const api::Endpoint endpoint =
          path == "/v1/completions" ? api::Endpoint::kCompletions : api::Endpoint::kChatCompletions;
      if (request.method != "POST") return method_not_allowed(endpoint_name(endpoint), "POST");
      generate(endpoint, request, out);
    } else {
      send_error(out,
                 api::ApiError(404, "invalid_request_error", "Unknown request URL: " + request.method + " " + path, "",
                               "unknown_url"),
                 "unknown");
    }
  } catch (const api::ApiError& e) {
    send_error(out, e, "other");
  }
}

api::ModelCard OpenAiService::model_card() const { return {config_.model_id, scheduler_.worker_info().n_ctx}; }

void OpenAiService::tokenize(const http::Request& request, http::ResponseWriter& out) {
  const api::TokenizeRequest r = api::parse_tokenize_request(request.body);
  if (!r.model.empty()) config_.check_model(r.model);
  std::vector<int32_t> tokens;
  try {
    if (!r.messages.empty()) {
      tokens = prompts_.encode_chat(r.messages);
    } else {
      tokens = r.add_special_tokens ? prompts_.encode_text(*r.prompt) : tokenizer_.encode(*r.prompt, false);
    }
  } catch (const Error& e) {
    throw api::invalid_request(e.what(), r.messages.empty() ? "prompt" : "messages");
  }
  std::vector<std::string> strs;
  if (r.return_token_strs) {
    for (int32_t id : tokens) strs.push_back(utf8::repair(tokenizer_.token_bytes(id)));
  }
  count("tokenize", 200);
  out.send(200, "application/json", api::tokenize_body(tokens, model_card().max_model_len,
                                                       r.return_token_strs ? &strs : nullptr));
}

void OpenAiService::detokenize(const http::Request& request, http::ResponseWriter& out) {
  const api::DetokenizeRequest r = api::parse_detokenize_request(request.body);
  if (!r.model.empty()) config_.check_model(r.model);
  for (int32_t id : r.tokens) {
    if (id >= tokenizer_.n_vocab()) {
      throw api::invalid_request("token id " + std::to_string(id) + " is outside the vocabulary of " +
                                     std::to_string(tokenizer_.n_vocab()) + " tokens",
                                 "tokens");
    }
  }
  count("detokenize", 200);
  out.send(200, "application/json", api::detokenize_body(utf8::repair(tokenizer_.decode(r.tokens))));
}

std::optional<OpenAiService::Admitted> OpenAiService::admit(api::Endpoint endpoint, const http::Request& request,
                                                           Clock::time_point arrival, http::ResponseWriter& out) {
  const std::string ep = endpoint_name(endpoint);
  const bool chat = endpoint == api::Endpoint::kChatCompletions;
  Admitted a;
  try {
    const std::string key = authenticate(request);
    if (config_.key_limiter) a.slot = config_.key_limiter->acquire(key);
    a.request = api::parse_generation_request(endpoint, request.body, config_.limits);
    log_ignored_fields(a.request.ignored_fields);
    config_.check_model(a.request.model);
    apply_tool_choice(a);
    std::vector<SequenceRequest> sequences = build_sequences(a, arrival);
    try {
      a.handles = scheduler_.submit(std::move(sequences));
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kUnavailable) {
        send_error(out, api::ApiError(503, "server_error", e.what(), "", "overloaded"), ep, {{"Retry-After", "1"}});
        return std::nullopt;
      }
      throw api::invalid_request(e.what(), chat ? "messages" : "prompt");
    }
  } catch (const api::ApiError& e) {
    send_error(out, e, ep);
    return std::nullopt;
  }
  return a;
}

void OpenAiService::apply_tool_choice(Admitted& a) const {
  api::GenerationRequest& r = a.request;
  if (r.tool_choice.mode == api::ToolChoice::Mode::kNone) return;
  a.tool_format = tool_call_format_of_template(tokenizer_.spec().chat_template);
  if (a.tool_format == ToolCallFormat::kNone) {
    throw api::invalid_request("This model's chat template teaches no tool-call format lazykv reads (<tool_call> "
                               "as Qwen2.5 and Hermes, or Llama 3's JSON); send tool_choice \"none\" or no tools",
                               "tools");
  }
  ForcedToolCall forced = force_tool_call(a.tool_format, r);
  a.forced_call = forced.opening;
  if (!forced.grammar.schema) return;
  if (r.response_grammar.schema) {
    throw api::invalid_request("'response_format' cannot shape a reply that tool_choice requires to be a call",
                               "response_format");
  }
  r.response_grammar = std::move(forced.grammar);
}

std::vector<SequenceRequest> OpenAiService::build_sequences(Admitted& a, Clock::time_point arrival) const {
  const api::GenerationRequest& r = a.request;
  const bool chat = r.endpoint == api::Endpoint::kChatCompletions;
  const size_t n_prompts = chat ? 1 : r.prompts.size();
  try {
    scheduler_.check_fits_queue(n_prompts * size_t(r.n));  // before n copies of each prompt are built
  } catch (const Error& e) {
    throw api::invalid_request(e.what(), "n");
  }
  const int32_t n_ctx = scheduler_.worker_info().n_ctx;
  const auto constraint = response_constraint(*constraints_, r);
  std::vector<SequenceRequest> sequences;
  for (size_t p = 0; p < n_prompts; ++p) {
    std::vector<int32_t> prompt = encode_request_prompt(prompts_, tokenizer_, r, p);
    if (chat && reasoning_ != ReasoningFormat::kNone) {
      const size_t tail = std::min<size_t>(prompt.size(), 8);
      a.prompt_opens_block = prompt_opens_thinking(tokenizer_.decode(std::span(prompt).last(tail)));
    }
    if (!a.forced_call.empty()) {
      // A forced call is the answer: a thinking block the template opened closes first.
      const std::string opening = (a.prompt_opens_block ? "</think>\n\n" : "") + a.forced_call;
      const std::vector<int32_t> ids = tokenizer_.encode(opening, false);
      prompt.insert(prompt.end(), ids.begin(), ids.end());
      a.prompt_opens_block = false;
    }
    if (!chat) a.prompt_texts.push_back(r.prompts[p].is_tokens ? tokenizer_.decode(prompt) : r.prompts[p].text);
    const int32_t max_tokens = resolve_max_tokens(r, int32_t(prompt.size()), n_ctx, config_);
    check_kv_policy(r, int32_t(prompt.size()), scheduler_.worker_info(), config_);
    for (SequenceRequest& s : make_sequences(r, prompt, max_tokens, config_, sequences.size(), arrival, constraint)) {
      sequences.push_back(std::move(s));
    }
  }
  return sequences;
}

void OpenAiService::generate(api::Endpoint endpoint, const http::Request& request, http::ResponseWriter& out) {
  const auto arrival = Clock::now();
  const std::string ep = endpoint_name(endpoint);
  const bool chat = endpoint == api::Endpoint::kChatCompletions;
  ++in_flight_;
  struct InFlight {
    std::atomic<int>& n;
    ~InFlight() { --n; }
  } in_flight{in_flight_};

  std::optional<Admitted> admitted = admit(endpoint, request, arrival, out);
  if (!admitted) return;
  const api::GenerationRequest& r = admitted->request;
  const std::vector<SequenceHandle>& handles = admitted->handles;
  const std::vector<std::string>& prompt_texts = admitted->prompt_texts;
  const bool prompt_opens_block = admitted->prompt_opens_block;
  const ToolCallFormat tool_format = admitted->tool_format;
  const std::string& forced_call = admitted->forced_call;

  // Answer from the sequences' events.
  std::map<uint64_t, size_t> index_of;
  for (size_t i = 0; i < handles.size(); ++i) index_of[handles[i].id] = i;
  const std::shared_ptr<SequenceStream> stream = handles.front().stream;
  const auto cancel_all = [&] {
    for (const SequenceHandle& h : handles) scheduler_.cancel(h.id);
  };
  const api::ResponseMeta meta{response_id(endpoint), unix_now(), config_.model_id};
  std::vector<api::Choice> choices(handles.size());
  std::vector<bool> done(handles.size(), false);
  size_t n_done = 0;
  api::Usage usage;
  std::vector<int64_t> prompt_counted(handles.size(), 0);
  std::optional<api::ApiError> failure;
  std::vector<int32_t> text_offset(handles.size(), 0);
  // Each choice's text splits into reasoning, content and tool calls (a
  // pass-through for completions).
  std::vector<ReplyText> replies;
  std::vector<std::vector<std::string>> call_ids(handles.size());  // per choice, of the calls streamed so far
  const bool reasoning = chat && reasoning_ != ReasoningFormat::kNone;
  if (reasoning) usage.reasoning_tokens = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    replies.emplace_back(chat ? reasoning_ : ReasoningFormat::kNone, prompt_opens_block, tool_format, forced_call);
    if (reasoning) choices[i].reasoning = "";
    choices[i].index = int(i);
    choices[i].has_logprobs = r.logprobs;
    if (r.echo) choices[i].text = prompt_texts[i / size_t(r.n)];
    text_offset[i] = int32_t(utf8::count_code_points(choices[i].text));
  }

  const bool streaming = r.stream;
  bool client_gone = false;
  const auto write = [&](const std::string& data) {
    if (!client_gone && !out.write_chunk(sse(data))) client_gone = true;
    return !client_gone;
  };
  if (streaming) {
    if (!out.start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}})) client_gone = true;
    for (size_t i = 0; i < choices.size() && !client_gone; ++i) {
      if (chat) {
        api::ChunkDelta first;
        first.index = int(i);
        first.first_of_choice = true;
        write(api::chunk_body(endpoint, meta, first, r.include_usage));
      } else if (r.echo) {
        api::ChunkDelta echo;
        echo.index = int(i);
        echo.text = choices[i].text;
        write(api::chunk_body(endpoint, meta, echo, r.include_usage));
      }
    }
  }

  auto next_poll = Clock::now() + kClientPoll;
  while (n_done < handles.size() && !client_gone) {
    std::vector<SequenceEvent> events = stream->wait(kClientPoll);
    // On a timer, not only when idle: a whole response writes nothing until
    // the end, and tokens may arrive faster than the poll interval.
    if (Clock::now() >= next_poll) {
      next_poll = Clock::now() + kClientPoll;
      if (out.client_gone()) {
        client_gone = true;
        break;
      }
    }
    for (SequenceEvent& e : events) {
      const size_t i = index_of.at(e.sequence);
      api::Choice& choice = choices[i];
      if (e.kind == SequenceEvent::Kind::kToken) {
        // The token's own place in the text, whatever stop strings hold back:
        // in characters (code points), as OpenAI's and Python servers' offsets
        // are; a control token adds nothing to the text.
        api::TokenLogprob lp = to_api(e.token, text_offset[i]);
        if (!tokenizer_.is_special(e.token.id)) text_offset[i] += int32_t(utf8::count_code_points(e.token.bytes));
        if (r.logprobs) choice.logprobs.push_back(lp);
        const bool was_thinking = replies[i].thinking();
        ReplyPiece piece = replies[i].push(e.text);
        const bool thinking = reasoning && (was_thinking || replies[i].thinking());
        if (thinking) {
          ++*usage.reasoning_tokens;
          metrics_.counter(metrics::kReasoningTokens).inc();
        }
        if (e.token.evicted_slots > 0) {
          metrics_.counter(metrics::kEvictionsByPhase, {thinking ? "thinking" : "answer"})
              .inc(double(e.token.evicted_slots));
        }
        choice.text += piece.content;
        if (choice.reasoning) *choice.reasoning += piece.reasoning;
        name_calls(piece.call_pieces, call_ids[i]);
        if (streaming && (!piece.content.empty() || !piece.reasoning.empty() || !piece.call_pieces.empty() ||
                          r.logprobs)) {
          api::ChunkDelta delta;
          delta.index = int(i);
          delta.text = std::move(piece.content);
          delta.reasoning = std::move(piece.reasoning);
          delta.tool_calls = std::move(piece.call_pieces);
          delta.has_logprobs = r.logprobs;
          if (r.logprobs) delta.logprobs.push_back(lp);
          write(api::chunk_body(endpoint, meta, delta, r.include_usage));
        }
        continue;
      }
      // The sequence finished.
      done[i] = true;
      ++n_done;
      usage.completion_tokens += e.completion_tokens;
      if (i % size_t(r.n) == 0) usage.prompt_tokens += e.prompt_tokens;  // each prompt once
      if (e.finish_reason == "error" || e.finish_reason == "cancelled") {
        if (!failure) {
          // A policy the request chose and the worker refused is the request's
          // error; the server's own default refused is the server's.
          const bool refused_request = e.invalid_request && r.kv_policy.has_value();
          failure = e.unavailable     ? api::ApiError(503, "server_error", e.error, "", "unavailable")
                    : refused_request ? api::ApiError(400, "invalid_request_error", e.error, "kv_policy")
                                      : api::ApiError(500, "server_error",
                                                      e.error.empty() ? "the sequence was cancelled" : e.error);
        }
        continue;
      }
      ReplyPiece rest = replies[i].finish(e.text);
      name_calls(rest.call_pieces, call_ids[i]);
      // Calls that began streaming keep their ids; the others arrive whole in the last piece.
      for (size_t k = 0; k < rest.calls.size(); ++k) {
        ToolCall& call = rest.calls[k];
        if (k < size_t(rest.calls_streamed) && k < call_ids[i].size()) {
          call.id = call_ids[i][k];
          continue;
        }
        call.id = tool_call_id();
        rest.call_pieces.push_back({int(k), call.name, call.id, call.arguments});
      }
      choice.text += rest.content;
      if (choice.reasoning) *choice.reasoning += rest.reasoning;
      choice.tool_calls = rest.calls;
      // As OpenAI: a reply that called tools ends with "tool_calls".
      choice.finish_reason = rest.calls.empty() || e.finish_reason != "stop" ? e.finish_reason : "tool_calls";
      if (streaming) {
        api::ChunkDelta last;
        last.index = int(i);
        if (chat && (!rest.content.empty() || !rest.reasoning.empty() || !rest.call_pieces.empty())) {
          last.text = std::move(rest.content);
          last.reasoning = std::move(rest.reasoning);
          last.tool_calls = std::move(rest.call_pieces);
          write(api::chunk_body(endpoint, meta, last, r.include_usage));
          last = api::ChunkDelta{};
          last.index = int(i);
        } else {
          last.text = std::move(rest.content);
        }
        last.finish_reason = choice.finish_reason;
        write(api::chunk_body(endpoint, meta, last, r.include_usage));
      }
    }
    if (failure) break;
  }

  const double seconds = std::chrono::duration<double>(Clock::now() - arrival).count();
  metrics_.histogram(metrics::kRequestDuration).observe(seconds);
  if (client_gone) {
    // Counted before the cancel, so the metrics never show the KV freed
    // without the cancellation.
    count(ep, 499);  // nginx's "client closed request"
    metrics_.counter(metrics::kErrors, {"cancelled"}).inc();
    cancel_all();
    return;
  }
  if (failure) cancel_all();
  if (streaming) {
    if (failure) {
      count(ep, failure->status);
      write(api::error_body(*failure));
    } else {
      count(ep, 200);
      if (r.include_usage) write(api::usage_chunk_body(endpoint, meta, usage));
    }
    write("[DONE]");
    out.end_stream();
    return;
  }
  if (failure) {
    send_error(out, *failure, ep, failure->status == 503 ? http::Headers{{"Retry-After", "1"}} : http::Headers{});
    return;
  }
  count(ep, 200);
  out.send(200, "application/json", api::completion_body(endpoint, meta, choices, usage));
}

}  // namespace lazykv
