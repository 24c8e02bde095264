#include "coordinator/api/openai_response.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "common/utf8.h"

namespace lazykv::api {

namespace {

// ordered_json: the keys come out in OpenAI's order.
using Json = nlohmann::ordered_json;

std::string dump(const Json& body) {
  // Every string put in is valid UTF-8 already; `replace` is a last guard so
  // formatting can never throw.
  return body.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// A float log-probability as the shortest decimal that reads back as the same
// float (-0.1, not -0.10000000149011612). -inf (a token the sampler could not
// pick) becomes -9999.0, the floor OpenAI reports.
double logprob_value(float v) {
  if (!std::isfinite(v)) return std::isnan(v) || v < 0 ? -9999.0 : 0.0;
  char buf[32];
  const auto result = std::to_chars(buf, buf + sizeof buf - 1, v);
  *result.ptr = '\0';
  return std::strtod(buf, nullptr);
}

// A token's text for a JSON string: a token may hold part of a multi-byte
// character, whose bytes become U+FFFD here (chat's "bytes" keeps them).
std::string token_text(const std::string& raw) { return utf8::repair(raw); }

Json token_bytes(const std::string& raw) {
  Json bytes = Json::array();
  for (const char c : raw) bytes.push_back(int(static_cast<unsigned char>(c)));
  return bytes;
}

// Completions (legacy) log-probabilities: parallel lists.
Json completion_logprobs(const std::vector<TokenLogprob>& logprobs) {
  Json tokens = Json::array();
  Json token_logprobs = Json::array();
  Json top_logprobs = Json::array();
  Json text_offset = Json::array();
  for (const TokenLogprob& lp : logprobs) {
    tokens.push_back(token_text(lp.token));
    token_logprobs.push_back(logprob_value(lp.logprob));
    Json top = Json::object();
    // emplace keeps the first (most likely) of two tokens that read the same.
    for (const TopLogprob& t : lp.top) top.emplace(token_text(t.token), logprob_value(t.logprob));
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(lp.text_offset);
  }
  Json out = Json::object();
  out["tokens"] = std::move(tokens);
  out["token_logprobs"] = std::move(token_logprobs);
  out["top_logprobs"] = std::move(top_logprobs);
  out["text_offset"] = std::move(text_offset);
  return out;
}

Json chat_token(const std::string& token, float logprob) {
  Json out = Json::object();
  out["token"] = token_text(token);
  out["logprob"] = logprob_value(logprob);
  out["bytes"] = token_bytes(token);
  return out;
}

Json chat_logprobs(const std::vector<TokenLogprob>& logprobs) {
  Json content = Json::array();
  for (const TokenLogprob& lp : logprobs) {
    Json entry = chat_token(lp.token, lp.logprob);
    Json top = Json::array();
    for (const TopLogprob& t : lp.top) top.push_back(chat_token(t.token, t.logprob));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  Json out = Json::object();
  out["content"] = std::move(content);
  out["refusal"] = nullptr;
  return out;
}

Json logprobs_json(Endpoint endpoint, bool has_logprobs, const std::vector<TokenLogprob>& logprobs) {
  if (!has_logprobs) return nullptr;
  return endpoint == Endpoint::kChatCompletions ? chat_logprobs(logprobs) : completion_logprobs(logprobs);
}

// OpenAI's message.tool_calls entries.
Json tool_calls_json(const std::vector<ToolCall>& calls) {
  Json out = Json::array();
  for (const ToolCall& c : calls) {
    out.push_back({{"id", c.id},
                   {"type", "function"},
                   {"function", {{"name", c.name}, {"arguments", utf8::repair(c.arguments)}}}});
  }
  return out;
}

// delta.tool_calls entries: the first piece of a call has its id, type and name.
Json tool_call_pieces_json(const std::vector<ToolCallDelta>& pieces) {
  Json out = Json::array();
  for (const ToolCallDelta& p : pieces) {
    Json call = {{"index", p.index}};
    Json function = Json::object();
    if (!p.name.empty()) {
      call["id"] = p.id;
      call["type"] = "function";
      function["name"] = p.name;
    }
    function["arguments"] = utf8::repair(p.arguments);
    call["function"] = std::move(function);
    out.push_back(std::move(call));
  }
  return out;
}

Json finish_reason_json(const std::string& reason) { return reason.empty() ? Json(nullptr) : Json(reason); }

Json usage_json(const Usage& usage) {
  Json out = Json::object();
  out["prompt_tokens"] = usage.prompt_tokens;
  out["completion_tokens"] = usage.completion_tokens;
  out["total_tokens"] = usage.prompt_tokens + usage.completion_tokens;
  if (usage.reasoning_tokens) out["completion_tokens_details"] = Json{{"reasoning_tokens", *usage.reasoning_tokens}};
  return out;
}

Json header(const ResponseMeta& meta, std::string_view object) {
  Json out = Json::object();
  out["id"] = meta.id;
  out["object"] = object;
  out["created"] = meta.created;
  out["model"] = utf8::repair(meta.model);
  return out;
}

std::string_view chunk_object(Endpoint endpoint) {
  return endpoint == Endpoint::kChatCompletions ? "chat.completion.chunk" : "text_completion";
}

Json model_object(const ModelCard& card, int64_t created) {
  Json model = Json::object();
  model["id"] = card.id;
  model["object"] = "model";
  model["created"] = created;
  model["owned_by"] = "lazykv";
  model["max_model_len"] = card.max_model_len;
  return model;
}

}  // namespace

std::string completion_body(Endpoint endpoint, const ResponseMeta& meta, const std::vector<Choice>& choices,
                            const Usage& usage) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  Json body = header(meta, chat ? "chat.completion" : "text_completion");
  Json out_choices = Json::array();
  for (const Choice& c : choices) {
    Json choice = Json::object();
    choice["index"] = c.index;
    if (chat) {
      Json message = Json::object();
      message["role"] = "assistant";
      message["content"] = c.tool_calls.empty() || !c.text.empty() ? Json(c.text) : Json(nullptr);
      if (!c.tool_calls.empty()) message["tool_calls"] = tool_calls_json(c.tool_calls);
      if (c.reasoning) message["reasoning_content"] = c.reasoning->empty() ? Json(nullptr) : Json(*c.reasoning);
      message["refusal"] = nullptr;
      choice["message"] = std::move(message);
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = logprobs_json(endpoint, c.has_logprobs, c.logprobs);
    choice["finish_reason"] = finish_reason_json(c.finish_reason);
    out_choices.push_back(std::move(choice));
  }
  body["choices"] = std::move(out_choices);
  body["usage"] = usage_json(usage);
  body["system_fingerprint"] = nullptr;
  return dump(body);
}

std::string chunk_body(Endpoint endpoint, const ResponseMeta& meta, const ChunkDelta& delta, bool include_usage) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  Json body = header(meta, chunk_object(endpoint));
  body["system_fingerprint"] = nullptr;
  Json choice = Json::object();
  choice["index"] = delta.index;
  if (chat) {
    Json d = Json::object();
    if (delta.first_of_choice) {
      d["role"] = "assistant";
      d["content"] = delta.text;
    } else if (!delta.text.empty() || (!delta.finish_reason && delta.reasoning.empty() && delta.tool_calls.empty())) {
      d["content"] = delta.text;
    }
    if (!delta.reasoning.empty()) d["reasoning_content"] = delta.reasoning;
    if (!delta.tool_calls.empty()) d["tool_calls"] = tool_call_pieces_json(delta.tool_calls);
    // else: the closing chunk of a choice, an empty delta with the reason.
    choice["delta"] = std::move(d);
  } else {
    choice["text"] = delta.text;
  }
  choice["logprobs"] = logprobs_json(endpoint, delta.has_logprobs, delta.logprobs);
  choice["finish_reason"] = delta.finish_reason ? Json(*delta.finish_reason) : Json(nullptr);
  body["choices"] = Json::array({std::move(choice)});
  if (include_usage) body["usage"] = nullptr;
  return dump(body);
}

std::string usage_chunk_body(Endpoint endpoint, const ResponseMeta& meta, const Usage& usage) {
  Json body = header(meta, chunk_object(endpoint));
  body["system_fingerprint"] = nullptr;
  body["choices"] = Json::array();
  body["usage"] = usage_json(usage);
  return dump(body);
}

std::string models_body(const std::vector<ModelCard>& models, int64_t created) {
  Json data = Json::array();
  for (const ModelCard& card : models) data.push_back(model_object(card, created));
  Json body = Json::object();
  body["object"] = "list";
  body["data"] = std::move(data);
  return dump(body);
}

std::string model_body(const ModelCard& model, int64_t created) { return dump(model_object(model, created)); }

std::string tokenize_body(const std::vector<int32_t>& tokens, int32_t max_model_len,
                          const std::vector<std::string>* token_strs) {
  Json body = Json::object();
  body["count"] = tokens.size();
  body["max_model_len"] = max_model_len;
  body["tokens"] = tokens;
  body["token_strs"] = token_strs ? Json(*token_strs) : Json(nullptr);
  return dump(body);
}

std::string detokenize_body(const std::string& text) {
  Json body = Json::object();
  body["prompt"] = text;
  return dump(body);
}

std::string error_body(const ApiError& error) {
  Json inner = Json::object();
  inner["message"] = utf8::repair(error.what());
  inner["type"] = error.type;
  inner["param"] = error.param.empty() ? Json(nullptr) : Json(error.param);
  inner["code"] = error.code.empty() ? Json(nullptr) : Json(error.code);
  Json body = Json::object();
  body["error"] = std::move(inner);
  return dump(body);
}

std::string status_error_body(int status, const std::string& message) {
  return error_body(ApiError(status, status >= 500 ? "server_error" : "invalid_request_error", message));
}

}  // namespace lazykv::api
