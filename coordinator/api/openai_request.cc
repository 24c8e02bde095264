#include "coordinator/api/openai_request.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/bounded_json.h"
#include "common/error.h"
#include "common/quote.h"
#include "common/sampling_limits.h"
#include "common/utf8.h"

namespace lazykv::api {

ApiError invalid_request(std::string message, std::string param, std::string code) {
  return ApiError(400, "invalid_request_error", std::move(message), std::move(param), std::move(code));
}

namespace {

// ordered_json keeps the fields in order of appearance (for ignored_fields).
using Json = nlohmann::ordered_json;

// Unknown field names are kept for the log: a few, and a short prefix of
// each, whatever size and number a client sends.
constexpr size_t kMaxIgnoredFieldsKept = 16;
constexpr size_t kMaxFieldNameKept = 64;

// The shortest form that reads back the same (100, 0.1, 1e-38) is friendlier
// than 17 digits.
std::string format_number(double value) {
  char buf[32];
  const auto result = std::to_chars(buf, buf + sizeof buf, value);
  return std::string(buf, result.ptr);
}

// What a JSON value is, for "'x' must be ..., got <this>".
std::string describe(const Json& value) {
  if (value.is_boolean()) return "boolean";
  if (value.is_number()) return "number " + format_number(value.get<double>());
  return value.type_name();
}

[[noreturn]] void wrong_type(const std::string& field, std::string_view expected, const Json& value,
                             const std::string& param) {
  throw invalid_request("'" + field + "' must be " + std::string(expected) + ", got " + describe(value), param);
}

[[noreturn]] void not_supported(const std::string& what, const std::string& param) {
  throw invalid_request(what + " is not supported by lazykv", param);
}

void require_utf8(const std::string& text, const std::string& field, const std::string& param) {
  // The JSON parser already rejects invalid UTF-8; this guards the invariant.
  if (!utf8::is_valid(text)) throw invalid_request("'" + field + "' is not valid UTF-8", param);
}

const std::string& get_string(const Json& value, const std::string& field, const std::string& param) {
  if (!value.is_string()) wrong_type(field, "a string", value, param);
  const std::string& text = value.get_ref<const std::string&>();
  require_utf8(text, field, param);
  return text;
}

bool get_bool(const Json& value, const std::string& field) {
  if (!value.is_boolean()) wrong_type(field, "a boolean", value, field);
  return value.get<bool>();
}

double get_number(const Json& value, const std::string& field) {
  if (!value.is_number()) wrong_type(field, "a number", value, field);
  return value.get<double>();
}

// An integer; a float with an integral value (1.0) counts. Values beyond
// int64 saturate, so range checks reject them with the usual message.
int64_t get_integer(const Json& value, const std::string& field, const std::string& param) {
  if (value.is_number_integer() && !value.is_number_unsigned()) return value.get<int64_t>();
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    return u > uint64_t(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max() : int64_t(u);
  }
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::isfinite(d) && d == std::floor(d)) {
      if (d >= 9.2e18) return std::numeric_limits<int64_t>::max();
      if (d <= -9.2e18) return std::numeric_limits<int64_t>::min();
      return int64_t(d);
    }
  }
  wrong_type(field, "an integer", value, param);
}

int64_t get_integer_in(const Json& value, const std::string& field, int64_t lo, int64_t hi) {
  const int64_t v = get_integer(value, field, field);
  if (v < lo || v > hi) {
    std::string range;
    if (hi >= std::numeric_limits<int32_t>::max()) {  // no practical upper bound
      range = "at least " + std::to_string(lo);
    } else {
      range = "between " + std::to_string(lo) + " and " + std::to_string(hi);
    }
    throw invalid_request("'" + field + "' must be " + range + ", got " + std::to_string(v), field);
  }
  return v;
}

// The bounds of a number; lo_open: the lower bound itself is excluded
// ((0, 1] for top_p). NaN is outside every range.
struct NumberRange {
  double lo;
  double hi;
  bool lo_open = false;
};

double check_number_in(double v, const std::string& field, NumberRange range) {
  const bool ok = (range.lo_open ? v > range.lo : v >= range.lo) && v <= range.hi;
  if (!ok) {
    throw invalid_request("'" + field + "' must be " + (range.lo_open ? "greater than " : "between ") +
                              format_number(range.lo) + (range.lo_open ? " and at most " : " and ") +
                              format_number(range.hi) + ", got " + format_number(v),
                          field);
  }
  return v;
}

double get_number_in(const Json& value, const std::string& field, NumberRange range) {
  return check_number_in(get_number(value, field), field, range);
}

constexpr NumberRange kTemperatureRange{0, 2};
constexpr NumberRange kTopPRange{0, 1, true};
constexpr NumberRange kMinPRange{0, 1};
constexpr NumberRange kPenaltyRange{-sampling_limits::kMaxAbsPenalty, sampling_limits::kMaxAbsPenalty};
constexpr NumberRange kRepetitionPenaltyRange{sampling_limits::kMinRepetitionPenalty,
                                              sampling_limits::kMaxRepetitionPenalty};
constexpr NumberRange kLogitBiasRange{-sampling_limits::kMaxAbsLogitBias, sampling_limits::kMaxAbsLogitBias};
using sampling_limits::kMaxLogitBiasEntries;
constexpr size_t kMaxTools = 128;

// What is known about the request while its fields are read; the rules that
// involve several fields are checked once all are in.
struct ParseState {
  explicit ParseState(const RequestLimits& l) : limits(l) {}
  const RequestLimits& limits;
  GenerationRequest request;
  bool has_model = false;
  bool has_prompt = false;
  bool has_messages = false;
  bool has_stream_options = false;  // a non-null stream_options
  std::optional<int32_t> max_tokens;
  std::optional<int32_t> max_completion_tokens;
  std::optional<int64_t> best_of;
  bool has_top_logprobs = false;
  bool has_tool_choice = false;
};

int32_t parse_max_tokens(const Json& value, const std::string& field, const RequestLimits& limits) {
  const int64_t v = get_integer(value, field, field);
  if (v < 1) throw invalid_request("'" + field + "' must be at least 1, got " + std::to_string(v), field);
  const int64_t cap = limits.max_tokens_cap > 0 ? limits.max_tokens_cap : std::numeric_limits<int32_t>::max();
  if (v > cap) {
    throw invalid_request("'" + field + "' is too large: " + std::to_string(v) + ". This server allows at most " +
                              std::to_string(cap) + " tokens per completion.",
                          field);
  }
  return int32_t(v);
}

int32_t parse_token_id(const Json& value, const std::string& field, const std::string& param = "prompt") {
  const int64_t id = get_integer(value, field, param);
  if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
    throw invalid_request("'" + field + "' is not a valid token id: " + std::to_string(id), param);
  }
  return int32_t(id);
}

Prompt token_prompt(const Json& ids, const std::string& field) {
  if (ids.empty()) throw invalid_request("'" + field + "' must not be empty", "prompt");
  Prompt p;
  p.is_tokens = true;
  p.tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    p.tokens.push_back(parse_token_id(ids[i], field + "[" + std::to_string(i) + "]"));
  }
  return p;
}

constexpr std::string_view kPromptForms =
    "a string, an array of strings, an array of token ids or an array of arrays of token ids";

void parse_prompt(ParseState& s, const Json& value) {
  std::vector<Prompt>& prompts = s.request.prompts;
  if (value.is_null()) throw invalid_request("'prompt' is required", "prompt");
  if (value.is_string()) {
    Prompt p;
    p.text = get_string(value, "prompt", "prompt");
    if (p.text.empty()) throw invalid_request("'prompt' must not be empty", "prompt");
    prompts.push_back(std::move(p));
  } else if (value.is_array()) {
    if (value.empty()) throw invalid_request("'prompt' must not be empty", "prompt");
    const Json& first = value.front();
    if (first.is_number()) {
      prompts.push_back(token_prompt(value, "prompt"));
    } else if (!first.is_string() && !first.is_array()) {
      wrong_type("prompt[0]", "a string, a token id or an array of token ids", first, "prompt");
    } else {
      for (size_t i = 0; i < value.size(); ++i) {
        const std::string field = "prompt[" + std::to_string(i) + "]";
        const Json& item = value[i];
        if (first.is_string() && item.is_string()) {
          Prompt p;
          p.text = get_string(item, field, "prompt");
          if (p.text.empty()) throw invalid_request("'" + field + "' must not be empty", "prompt");
          prompts.push_back(std::move(p));
        } else if (first.is_array() && item.is_array()) {
          prompts.push_back(token_prompt(item, field));
        } else {
          throw invalid_request("'prompt' must be " + std::string(kPromptForms) + "; '" + field + "' is " +
                                    describe(item) + " but 'prompt[0]' is " + describe(first),
                                "prompt");
        }
        if (s.limits.max_prompts > 0 && prompts.size() > size_t(s.limits.max_prompts)) break;
      }
    }
  } else {
    wrong_type("prompt", kPromptForms, value, "prompt");
  }
  if (s.limits.max_prompts > 0 && prompts.size() > size_t(s.limits.max_prompts)) {
    throw invalid_request("'prompt' holds more than " + std::to_string(s.limits.max_prompts) +
                              " prompts, the most this server accepts in one request",
                          "prompt");
  }
  s.has_prompt = true;
}

std::string parse_content(const Json& content, const std::string& field) {
  if (content.is_string()) return get_string(content, field, field);
  if (!content.is_array()) wrong_type(field, "a string or an array of content parts", content, field);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string part_field = field + "[" + std::to_string(i) + "]";
    const Json& part = content[i];
    if (!part.is_object()) wrong_type(part_field, "an object", part, field);
    const auto type = part.find("type");
    if (type == part.end()) throw invalid_request("'" + part_field + ".type' is required", field);
    const std::string& kind = get_string(*type, part_field + ".type", field);
    if (kind != "text") {
      throw invalid_request("Content part type " + quote(kind) + " in '" + part_field +
                                "' is not supported by lazykv (only 'text' parts are)",
                            field);
    }
    const auto part_text = part.find("text");
    if (part_text == part.end()) throw invalid_request("'" + part_field + ".text' is required", field);
    text += get_string(*part_text, part_field + ".text", field);
  }
  return text;
}

// One structured output per request.
void set_response_grammar(ParseState& s, grammar::ResponseGrammar g, const std::string& field) {
  if (s.request.response_grammar.schema) {
    throw invalid_request("only one of 'response_format' (json_object or json_schema), 'guided_json' and "
                          "'guided_choice' may be given",
                          field);
  }
  s.request.response_grammar = std::move(g);
}

grammar::ResponseGrammar compile_schema(const Json& schema, const std::string& field) {
  // The compiler reads plain nlohmann::json; properties are sorted there anyway.
  const nlohmann::json plain = nlohmann::json::parse(schema.dump());
  try {
    return {"schema:" + plain.dump(), std::make_shared<const grammar::JsonSchema>(grammar::compile_json_schema(plain))};
  } catch (const Error& e) {
    throw invalid_request(e.what(), field);
  }
}

void parse_response_format(ParseState& s, const Json& v) {
  if (!v.is_object()) wrong_type("response_format", "an object", v, "response_format");
  const auto type = v.find("type");
  if (type == v.end()) throw invalid_request("'response_format.type' is required", "response_format");
  const std::string& kind = get_string(*type, "response_format.type", "response_format");
  if (kind == "text") return;
  if (kind == "json_object") {
    static const auto any_object = std::make_shared<const grammar::JsonSchema>(grammar::any_json_object());
    return set_response_grammar(s, {"json_object", any_object}, "response_format");
  }
  if (kind != "json_schema") not_supported("'response_format' of type " + quote(kind), "response_format");
  const auto spec = v.find("json_schema");
  if (spec == v.end() || !spec->is_object()) {
    throw invalid_request("'response_format.json_schema' is required with type json_schema: an object with "
                          "'name' and 'schema'",
                          "response_format");
  }
  if (const auto name = spec->find("name"); name != spec->end()) {
    get_string(*name, "response_format.json_schema.name", "response_format");
  }
  const auto schema = spec->find("schema");
  if (schema == spec->end()) {
    throw invalid_request("'response_format.json_schema.schema' is required (the JSON schema of the reply)",
                          "response_format");
  }
  set_response_grammar(s, compile_schema(*schema, "response_format"), "response_format");
}

// tool_choice against tools, once both are read. OpenAI's default is
// "auto" with tools and "none" without.
void check_tool_choice(ParseState& s) {
  ToolChoice& choice = s.request.tool_choice;
  const bool has_tools = !s.request.tools.empty();
  if (!s.has_tool_choice) choice.mode = has_tools ? ToolChoice::Mode::kAuto : ToolChoice::Mode::kNone;
  if (choice.mode != ToolChoice::Mode::kNone && !has_tools) {
    throw invalid_request("'tool_choice' is only allowed together with 'tools'", "tool_choice");
  }
  if (choice.mode == ToolChoice::Mode::kFunction) {
    const bool known = std::any_of(s.request.tools.begin(), s.request.tools.end(), [&](const Json& t) {
      return t["function"]["name"] == choice.function;
    });
    if (!known) {
      throw invalid_request("'tool_choice' names " + quote(choice.function) + ", which is not in 'tools'",
                            "tool_choice");
    }
  }
}

// OpenAI's function names: letters, digits, '_' and '-', at most 64.
bool valid_function_name(const std::string& name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

std::string function_name(const Json& fn, const std::string& field, const std::string& param) {
  const auto name = fn.find("name");
  if (name == fn.end() || name->is_null()) throw invalid_request("'" + field + ".name' is required", param);
  const std::string& text = get_string(*name, field + ".name", param);
  if (!valid_function_name(text)) {
    throw invalid_request("'" + field + ".name' must be 1 to 64 letters, digits, '_' or '-', got " +
                              quote(printable(text, kMaxFieldNameKept)),
                          param);
  }
  return text;
}

// [{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}, ...]
void parse_tools(ParseState& s, const Json& value) {
  if (!value.is_array()) wrong_type("tools", "an array of tools", value, "tools");
  if (value.size() > kMaxTools) {
    throw invalid_request("'tools' has " + std::to_string(value.size()) + " tools; at most " +
                              std::to_string(kMaxTools) + " are allowed",
                          "tools");
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string field = "tools[" + std::to_string(i) + "]";
    const Json& tool = value[i];
    if (!tool.is_object()) wrong_type(field, "an object", tool, "tools");
    const auto type = tool.find("type");
    if (type == tool.end()) throw invalid_request("'" + field + ".type' is required", "tools");
    const std::string& kind = get_string(*type, field + ".type", "tools");
    if (kind != "function") not_supported("Tools of type " + quote(kind) + " (only \"function\")", "tools");
    const auto fn = tool.find("function");
    if (fn == tool.end() || !fn->is_object()) {
      throw invalid_request("'" + field + ".function' must be an object", "tools");
    }
    const std::string name = function_name(*fn, field + ".function", "tools");
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      throw invalid_request("'tools' names the function " + quote(name) + " twice", "tools");
    }
    names.push_back(name);
    const auto description = fn->find("description");
    if (description != fn->end() && !description->is_null()) {
      get_string(*description, field + ".function.description", "tools");
    }
    const auto parameters = fn->find("parameters");
    if (parameters != fn->end() && !parameters->is_null() && !parameters->is_object()) {
      wrong_type(field + ".function.parameters", "a JSON Schema object", *parameters, "tools");
    }
    s.request.tools.push_back(tool);
  }
}

// "none", "auto", "required", or {"type": "function", "function": {"name": ...}}.
void parse_tool_choice(ParseState& s, const Json& value) {
  ToolChoice& choice = s.request.tool_choice;
  s.has_tool_choice = true;
  if (value.is_string()) {
    const std::string& mode = value.get_ref<const std::string&>();
    if (mode == "none") {
      choice.mode = ToolChoice::Mode::kNone;
    } else if (mode == "auto") {
      choice.mode = ToolChoice::Mode::kAuto;
    } else if (mode == "required") {
      choice.mode = ToolChoice::Mode::kRequired;
    } else {
      throw invalid_request("'tool_choice' must be \"none\", \"auto\", \"required\" or a function, got " +
                                quote(printable(mode, kMaxFieldNameKept)),
                            "tool_choice");
    }
    return;
  }
  if (!value.is_object()) wrong_type("tool_choice", "a string or an object", value, "tool_choice");
  const auto fn = value.find("function");
  if (fn == value.end() || !fn->is_object()) {
    throw invalid_request("'tool_choice.function' must be an object with a 'name'", "tool_choice");
  }
  choice.mode = ToolChoice::Mode::kFunction;
  choice.function = function_name(*fn, "tool_choice.function", "tool_choice");
}

// An assistant turn's [{"id", "type": "function", "function": {"name", "arguments"}}, ...].
std::vector<ToolCall> parse_tool_calls(const Json& value, const std::string& field) {
  if (!value.is_array()) wrong_type(field, "an array of tool calls", value, field);
  std::vector<ToolCall> calls;
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string at = field + "[" + std::to_string(i) + "]";
    const Json& c = value[i];
    if (!c.is_object()) wrong_type(at, "an object", c, field);
    ToolCall call;
    const auto id = c.find("id");
    if (id != c.end() && !id->is_null()) call.id = get_string(*id, at + ".id", field);
    const auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object()) throw invalid_request("'" + at + ".function' must be an object", field);
    call.name = function_name(*fn, at + ".function", field);
    const auto arguments = fn->find("arguments");
    if (arguments != fn->end() && !arguments->is_null()) {
      call.arguments = get_string(*arguments, at + ".function.arguments", field);
    }
    calls.push_back(std::move(call));
  }
  return calls;
}

void parse_messages(ParseState& s, const Json& value) {
  if (value.is_null()) throw invalid_request("'messages' is required", "messages");
  if (!value.is_array()) wrong_type("messages", "an array of messages", value, "messages");
  if (value.empty()) throw invalid_request("'messages' must not be empty", "messages");
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string field = "messages[" + std::to_string(i) + "]";
    const Json& m = value[i];
    if (!m.is_object()) wrong_type(field, "an object", m, field);
    const auto role_it = m.find("role");
    if (role_it == m.end()) throw invalid_request("'" + field + ".role' is required", field + ".role");
    std::string role = get_string(*role_it, field + ".role", field + ".role");
    if (role == "developer") role = "system";  // OpenAI's newer name for system instructions
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      throw invalid_request("'" + field + ".role' must be one of 'system', 'developer', 'user', 'assistant', " +
                                "'tool', got " + quote(role),
                            field + ".role");
    }
    const auto legacy_call = m.find("function_call");
    if (legacy_call != m.end() && !legacy_call->is_null()) {
      not_supported("'" + field + ".function_call' (use tool_calls)", field + ".function_call");
    }
    const std::string content_field = field + ".content";
    const auto content = m.find("content");
    ChatMessage message;
    const auto calls = m.find("tool_calls");
    if (calls != m.end() && !calls->is_null() && !(calls->is_array() && calls->empty())) {
      if (role != "assistant") {
        throw invalid_request("only assistant messages have 'tool_calls'", field + ".tool_calls");
      }
      message.tool_calls = parse_tool_calls(*calls, field + ".tool_calls");
    }
    const auto call_id = m.find("tool_call_id");
    if (call_id != m.end() && !call_id->is_null()) {
      message.tool_call_id = get_string(*call_id, field + ".tool_call_id", field + ".tool_call_id");
    }
    message.role = std::move(role);
    if (content == m.end() || content->is_null()) {
      // An assistant turn may be empty (OpenAI allows null content there).
      if (message.role != "assistant") throw invalid_request("'" + content_field + "' is required", content_field);
    } else {
      message.content = parse_content(*content, content_field);
    }
    s.request.messages.push_back(std::move(message));
  }
  s.has_messages = true;
}

void parse_stop(ParseState& s, const Json& value) {
  std::vector<std::string>& stop = s.request.stop;
  if (value.is_string()) {
    const std::string& text = get_string(value, "stop", "stop");
    if (!text.empty()) stop.push_back(text);
    return;
  }
  if (!value.is_array()) wrong_type("stop", "a string or an array of strings", value, "stop");
  if (s.limits.max_stop > 0 && value.size() > size_t(s.limits.max_stop)) {
    throw invalid_request("'stop' has " + std::to_string(value.size()) + " strings; at most " +
                              std::to_string(s.limits.max_stop) + " are allowed",
                          "stop");
  }
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string& text = get_string(value[i], "stop[" + std::to_string(i) + "]", "stop");
    if (!text.empty()) stop.push_back(text);
  }
}

void parse_kv_policy(ParseState& s, const Json& value) {
  if (!value.is_object()) wrong_type("kv_policy", "an object such as {\"name\": \"lazy\", \"budget\": 512}", value,
                                     "kv_policy");
  // Built field by field (scalars only) so that a deeply nested value is
  // rejected here instead of being copied recursively.
  nlohmann::json spec = nlohmann::json::object();
  for (const auto& [key, item] : value.items()) {
    require_utf8(key, "kv_policy", "kv_policy");
    if (item.is_string()) {
      spec[key] = get_string(item, "kv_policy." + key, "kv_policy");
    } else if (item.is_boolean()) {
      spec[key] = item.get<bool>();
    } else if (item.is_number_float()) {
      spec[key] = item.get<double>();
    } else if (item.is_number_unsigned()) {
      spec[key] = item.get<uint64_t>();
    } else if (item.is_number_integer()) {
      spec[key] = item.get<int64_t>();
    } else if (item.is_null()) {
      spec[key] = nullptr;
    } else {
      wrong_type("kv_policy." + key, key == "name" ? "a string" : "a number", item, "kv_policy");
    }
  }
  try {
    s.request.kv_policy = make_policy_config(spec);
  } catch (const Error& e) {
    throw invalid_request("Invalid 'kv_policy': " + utf8::repair(e.what()), "kv_policy");
  }
}

// {"50256": -100, ...}: token ids as decimal strings, as OpenAI's.
void parse_logit_bias(ParseState& s, const Json& value) {
  if (!value.is_object()) wrong_type("logit_bias", "an object of token ids to numbers", value, "logit_bias");
  if (value.size() > kMaxLogitBiasEntries) {
    throw invalid_request("'logit_bias' has " + std::to_string(value.size()) + " entries; at most " +
                              std::to_string(kMaxLogitBiasEntries) + " are allowed",
                          "logit_bias");
  }
  for (const auto& [key, bias] : value.items()) {
    int32_t token = -1;
    const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), token);
    if (error != std::errc() || end != key.data() + key.size() || token < 0) {
      throw invalid_request("'logit_bias' keys must be token ids (non-negative integers as strings), got " +
                                quote(printable(key, kMaxFieldNameKept)),
                            "logit_bias");
    }
    const std::string field = "logit_bias." + key;
    if (!bias.is_number()) wrong_type(field, "a number", bias, "logit_bias");
    const double b = bias.get<double>();
    if (!(b >= kLogitBiasRange.lo && b <= kLogitBiasRange.hi)) {
      throw invalid_request("'" + field + "' must be between -100 and 100, got " + format_number(b), "logit_bias");
    }
    // "5" and "05" name one token: the later entry replaces it, as in a dict.
    std::erase_if(s.request.logit_bias, [&](const auto& entry) { return entry.first == token; });
    s.request.logit_bias.emplace_back(token, float(b));
  }
}

enum class Scope { kBoth, kCompletions, kChat };

struct FieldRule {
  std::string_view name;
  Scope scope;
  bool null_is_unset;  // null means "not given" (every optional field)
  void (*apply)(ParseState&, const Json&);
};

const FieldRule kRules[] = {
    {"model", Scope::kBoth, false,
     [](ParseState& s, const Json& v) {
       if (v.is_null()) return;  // reported as missing below
       s.request.model = get_string(v, "model", "model");
       s.has_model = !s.request.model.empty();
     }},
    {"prompt", Scope::kCompletions, false, parse_prompt},
    {"messages", Scope::kChat, false, parse_messages},
    {"max_tokens", Scope::kBoth, true,
     [](ParseState& s, const Json& v) { s.max_tokens = parse_max_tokens(v, "max_tokens", s.limits); }},
    {"max_completion_tokens", Scope::kChat, true,
     [](ParseState& s, const Json& v) {
       s.max_completion_tokens = parse_max_tokens(v, "max_completion_tokens", s.limits);
     }},
    {"temperature", Scope::kBoth, true,
     [](ParseState& s, const Json& v) { s.request.temperature = float(get_number_in(v, "temperature", kTemperatureRange)); }},
    {"top_p", Scope::kBoth, true,
     [](ParseState& s, const Json& v) {
       // A positive top_p below the smallest float keeps only the likeliest
       // token, as the smallest float does; rounded to 0 the sampler would refuse it.
       s.request.top_p = std::max(float(get_number_in(v, "top_p", kTopPRange)), std::numeric_limits<float>::min());
     }},
    {"top_k", Scope::kBoth, true,
     [](ParseState& s, const Json& v) {
       s.request.top_k = int(get_integer_in(v, "top_k", 0, std::numeric_limits<int32_t>::max()));
     }},
    {"min_p", Scope::kBoth, true,
     [](ParseState& s, const Json& v) { s.request.min_p = float(get_number_in(v, "min_p", kMinPRange)); }},
    {"ignore_eos", Scope::kBoth, true,
     [](ParseState& s, const Json& v) { s.request.ignore_eos = get_bool(v, "ignore_eos"); }},
    {"seed", Scope::kBoth, true,
     [](ParseState& s, const Json& v) {
       // OpenAI's schema allows any int64; the sampler takes the bits as uint64.
       if (v.is_number_unsigned()) {
         s.request.seed = v.get<uint64_t>();
       } else {
         const int64_t seed = get_integer(v, "seed", "seed");
         if (v.is_number_float() && (seed == std::numeric_limits<int64_t>::max() ||
                                     seed == std::numeric_limits<int64_t>::min())) {
           throw invalid_request("'seed' must fit in a 64-bit integer, got " + describe(v), "seed");
         }
         s.request.seed = uint64_t(seed);
       }
     }},
    {"stop", Scope::kBoth, true, parse_stop},
    {"n", Scope::kBoth, true,
     [](ParseState& s, const Json& v) {
       const int64_t hi = s.limits.max_n > 0 ? s.limits.max_n : std::numeric_limits<int32_t>::max();
       s.request.n = int(get_integer_in(v, "n", 1, hi));
     }},
    {"stream", Scope::kBoth, true, [](ParseState& s, const Json& v) { s.request.stream = get_bool(v, "stream"); }},
    {"stream_options", Scope::kBoth, true,
     [](ParseState& s, const Json& v) {
       if (!v.is_object()) wrong_type("stream_options", "an object", v, "stream_options");
       s.has_stream_options = true;
       const auto usage = v.find("include_usage");
       if (usage != v.end() && !usage->is_null()) {
         s.request.include_usage = get_bool(*usage, "stream_options.include_usage");
       }
     }},
    {"logprobs", Scope::kCompletions, true,
     [](ParseState& s, const Json& v) {
       s.request.top_logprobs = int(get_integer_in(v, "logprobs", 0, 5));
       s.request.logprobs = true;
     }},
    {"logprobs", Scope::kChat, true,
     [](ParseState& s, const Json& v) { s.request.logprobs = get_bool(v, "logprobs"); }},
    {"top_logprobs", Scope::kChat, true,
     [](ParseState& s, const Json& v) {
       s.request.top_logprobs = int(get_integer_in(v, "top_logprobs", 0, 20));
       s.has_top_logprobs = true;
     }},
    {"echo", Scope::kCompletions, true, [](ParseState& s, const Json& v) { s.request.echo = get_bool(v, "echo"); }},
    {"best_of", Scope::kCompletions, true,
     [](ParseState& s, const Json& v) { s.best_of = get_integer(v, "best_of", "best_of"); }},
    {"suffix", Scope::kCompletions, true,
     [](ParseState&, const Json& v) {
       if (!get_string(v, "suffix", "suffix").empty()) not_supported("'suffix' (insertion)", "suffix");
     }},
    {"presence_penalty", Scope::kBoth, true,
     [](ParseState& s, const Json& v) {
       s.request.presence_penalty = float(get_number_in(v, "presence_penalty", kPenaltyRange));
     }},
    {"frequency_penalty", Scope::kBoth, true,
     [](ParseState& s, const Json& v) {
       s.request.frequency_penalty = float(get_number_in(v, "frequency_penalty", kPenaltyRange));
     }},
    {"repetition_penalty", Scope::kBoth, true,
     [](ParseState& s, const Json& v) {
       s.request.repetition_penalty = float(get_number_in(v, "repetition_penalty", kRepetitionPenaltyRange));
     }},
    {"logit_bias", Scope::kBoth, true, parse_logit_bias},
    {"min_tokens", Scope::kBoth, true,
     [](ParseState& s, const Json& v) {
       s.request.min_tokens = int32_t(get_integer_in(v, "min_tokens", 0, std::numeric_limits<int32_t>::max()));
     }},
    {"tools", Scope::kChat, true, parse_tools},
    {"tool_choice", Scope::kChat, true, parse_tool_choice},
    // Completions have no tools: an empty list and "none" ask for nothing, so they pass.
    {"tools", Scope::kCompletions, true,
     [](ParseState&, const Json& v) {
       if (!(v.is_array() && v.empty())) not_supported("'tools' with /v1/completions (use chat)", "tools");
     }},
    {"functions", Scope::kBoth, true,
     [](ParseState&, const Json& v) {
       if (!(v.is_array() && v.empty())) not_supported("'functions' (function calling)", "functions");
     }},
    {"tool_choice", Scope::kCompletions, true,
     [](ParseState&, const Json& v) {
       if (!(v.is_string() && v.get_ref<const std::string&>() == "none")) {
         not_supported("'tool_choice' with /v1/completions (use chat)", "tool_choice");
       }
     }},
    {"function_call", Scope::kBoth, true,
     [](ParseState&, const Json& v) {
       if (!(v.is_string() && v.get_ref<const std::string&>() == "none")) {
         not_supported("'function_call' (function calling)", "function_call");
       }
     }},
    {"response_format", Scope::kBoth, true, parse_response_format},
    {"guided_json", Scope::kBoth, true,
     [](ParseState& s, const Json& v) {
       // A schema, or (as vLLM also takes it) a string holding one.
       if (v.is_string()) {
         Json schema;
         try {
           schema = Json::parse(v.get_ref<const std::string&>());
         } catch (const Json::exception&) {
           throw invalid_request("'guided_json' is a string that is not JSON", "guided_json");
         }
         return set_response_grammar(s, compile_schema(schema, "guided_json"), "guided_json");
       }
       set_response_grammar(s, compile_schema(v, "guided_json"), "guided_json");
     }},
    {"guided_choice", Scope::kBoth, true,
     [](ParseState& s, const Json& v) {
       if (!v.is_array() || v.empty()) wrong_type("guided_choice", "a non-empty array of strings", v, "guided_choice");
       std::vector<std::string> choices;
       for (size_t i = 0; i < v.size(); ++i) {
         choices.push_back(get_string(v[i], "guided_choice[" + std::to_string(i) + "]", "guided_choice"));
         if (choices.back().empty()) throw invalid_request("'guided_choice' has an empty string", "guided_choice");
       }
       const std::string key = "choice:" + v.dump();
       set_response_grammar(s, {key, std::make_shared<const grammar::JsonSchema>(grammar::one_of_texts(choices))},
                            "guided_choice");
     }},
    {"guided_regex", Scope::kBoth, true,
     [](ParseState&, const Json&) { not_supported("'guided_regex' (use guided_json or guided_choice)", "guided_regex"); }},
    {"guided_grammar", Scope::kBoth, true,
     [](ParseState&, const Json&) { not_supported("'guided_grammar' (use guided_json or guided_choice)", "guided_grammar"); }},
    {"modalities", Scope::kBoth, true,
     [](ParseState&, const Json& v) {
       if (!v.is_array()) wrong_type("modalities", "an array of strings", v, "modalities");
       for (size_t i = 0; i < v.size(); ++i) {
         const std::string& m = get_string(v[i], "modalities[" + std::to_string(i) + "]", "modalities");
         if (m != "text") not_supported("Output modality " + quote(m), "modalities");
       }
     }},
    {"audio", Scope::kBoth, true, [](ParseState&, const Json&) { not_supported("'audio' output", "audio"); }},
    {"web_search_options", Scope::kBoth, true,
     [](ParseState&, const Json&) { not_supported("'web_search_options' (web search)", "web_search_options"); }},
    {"user", Scope::kBoth, true,
     [](ParseState& s, const Json& v) { s.request.user = get_string(v, "user", "user"); }},
    {"kv_policy", Scope::kBoth, true, parse_kv_policy},
    // Accepted and ignored without a note: they change neither the output
    // nor what the client expects back.
    {"metadata", Scope::kBoth, true, [](ParseState&, const Json&) {}},
    {"store", Scope::kBoth, true, [](ParseState&, const Json&) {}},
    {"service_tier", Scope::kBoth, true, [](ParseState&, const Json&) {}},
    {"parallel_tool_calls", Scope::kBoth, true, [](ParseState&, const Json&) {}},
    {"reasoning_effort", Scope::kBoth, true, [](ParseState&, const Json&) {}},
    {"prompt_cache_key", Scope::kBoth, true, [](ParseState&, const Json&) {}},
    {"safety_identifier", Scope::kBoth, true, [](ParseState&, const Json&) {}},
};

const FieldRule* find_rule(std::string_view name, Endpoint endpoint) {
  const Scope own = endpoint == Endpoint::kChatCompletions ? Scope::kChat : Scope::kCompletions;
  for (const FieldRule& rule : kRules) {
    if (rule.name == name && (rule.scope == Scope::kBoth || rule.scope == own)) return &rule;
  }
  return nullptr;
}

// "[json.exception.parse_error.101] parse error at line 1, column 2: ..." ->
// "parse error at line 1, column 2: ...", made valid UTF-8 (the parser quotes
// the bytes it last read, which may be the invalid ones).
std::string parser_detail(const nlohmann::json::exception& e) {
  std::string_view what = e.what();
  if (!what.empty() && what.front() == '[') {
    const size_t close = what.find("] ");
    if (close != std::string_view::npos) what.remove_prefix(close + 2);
  }
  return utf8::repair(what);
}

Json parse_body(std::string_view body) {
  try {
    return parse_bounded_json<Json>(body);
  } catch (const JsonLimitError&) {
    throw invalid_request("The request body nests arrays and objects deeper than " + std::to_string(kMaxJsonDepth) +
                          " levels");
  } catch (const nlohmann::json::parse_error& e) {
    const std::string detail = parser_detail(e);
    if (detail.find("UTF-8") != std::string::npos) {
      throw invalid_request("The request body is not valid UTF-8 (" + detail + ")");
    }
    if (detail.find("surrogate") != std::string::npos) {
      throw invalid_request("The request body has an invalid \\u escape, an unpaired UTF-16 surrogate (" + detail +
                            ")");
    }
    throw invalid_request("The request body is not valid JSON (" + detail + ")");
  } catch (const nlohmann::json::exception& e) {
    // out_of_range.406: a number literal beyond double's range.
    throw invalid_request("The request body has a number too large to represent (" + parser_detail(e) + ")");
  }
}

Json parse_object_body(std::string_view body) {
  Json root = parse_body(body);
  if (!root.is_object()) throw invalid_request("The request body must be a JSON object, got " + describe(root));
  return root;
}

}  // namespace

void check_sampling_number(const std::string& field, double value) {
  if (field == "temperature") {
    check_number_in(value, field, kTemperatureRange);
  } else if (field == "top_p") {
    check_number_in(value, field, kTopPRange);
  } else if (field == "min_p") {
    check_number_in(value, field, kMinPRange);
  } else if (field == "presence_penalty" || field == "frequency_penalty") {
    check_number_in(value, field, kPenaltyRange);
  } else if (field == "repetition_penalty") {
    check_number_in(value, field, kRepetitionPenaltyRange);
  } else if (field == "logit_bias") {
    check_number_in(value, field, kLogitBiasRange);
  } else if (!std::isfinite(value)) {
    throw invalid_request("'" + field + "' must be a finite number, got " + format_number(value), field);
  }
}

GenerationRequest parse_generation_request(Endpoint endpoint, std::string_view body, const RequestLimits& limits) {
  const Json root = parse_object_body(body);
  const bool chat = endpoint == Endpoint::kChatCompletions;
  ParseState s(limits);
  s.request.endpoint = endpoint;
  for (const auto& [key, value] : root.items()) {
    const FieldRule* rule = find_rule(key, endpoint);
    if (rule == nullptr) {
      if (s.request.ignored_fields.size() < kMaxIgnoredFieldsKept) {
        s.request.ignored_fields.push_back(printable(key, kMaxFieldNameKept));
      }
      continue;
    }
    if (value.is_null() && rule->null_is_unset) continue;
    rule->apply(s, value);
  }

  if (!s.has_model) throw invalid_request("'model' is required (a non-empty string)", "model");
  if (chat && !s.has_messages) throw invalid_request("'messages' is required", "messages");
  if (!chat && !s.has_prompt) throw invalid_request("'prompt' is required", "prompt");

  s.request.max_tokens = s.max_completion_tokens ? s.max_completion_tokens : s.max_tokens;
  // As OpenAI; but {"include_usage": false} asks for nothing, so some
  // clients send it with every request, streamed or not.
  if (s.has_stream_options && s.request.include_usage && !s.request.stream) {
    throw invalid_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
  }
  if (!s.request.stream) s.request.include_usage = false;
  if (chat && s.has_top_logprobs && !s.request.logprobs) {
    throw invalid_request("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
  }
  if (s.request.echo && s.request.logprobs) {
    not_supported("'echo' together with 'logprobs' (log-probabilities of the prompt)", "echo");
  }
  check_tool_choice(s);
  if (s.request.response_grammar.schema) {
    // The grammar decides where the output ends.
    if (s.request.ignore_eos) not_supported("'ignore_eos' together with a structured output", "ignore_eos");
    if (s.request.min_tokens > 0) not_supported("'min_tokens' together with a structured output", "min_tokens");
  }
  if (s.request.max_tokens && s.request.min_tokens > *s.request.max_tokens) {
    throw invalid_request("'min_tokens' (" + std::to_string(s.request.min_tokens) + ") must not exceed 'max_tokens' (" +
                              std::to_string(*s.request.max_tokens) + ")",
                          "min_tokens");
  }
  if (s.best_of && *s.best_of != s.request.n) {
    not_supported("'best_of' different from 'n' (" + std::to_string(*s.best_of) + " vs " +
                      std::to_string(s.request.n) + ")",
                  "best_of");
  }
  return std::move(s.request);
}

TokenizeRequest parse_tokenize_request(std::string_view body) {
  const Json root = parse_object_body(body);
  TokenizeRequest r;
  RequestLimits limits;
  ParseState s(limits);
  bool has_prompt = false;
  for (const auto& [key, value] : root.items()) {
    if (value.is_null()) continue;
    if (key == "model") {
      r.model = get_string(value, "model", "model");
    } else if (key == "prompt") {
      r.prompt = get_string(value, "prompt", "prompt");
      has_prompt = true;
    } else if (key == "messages") {
      parse_messages(s, value);
    } else if (key == "add_special_tokens") {
      r.add_special_tokens = get_bool(value, "add_special_tokens");
    } else if (key == "add_generation_prompt") {
      if (!get_bool(value, "add_generation_prompt")) {
        not_supported("'add_generation_prompt': false (messages are rendered for a reply)", "add_generation_prompt");
      }
    } else if (key == "return_token_strs") {
      r.return_token_strs = get_bool(value, "return_token_strs");
    }
  }
  if (has_prompt == s.has_messages) {
    throw invalid_request("Exactly one of 'prompt' and 'messages' is required", "prompt");
  }
  r.messages = std::move(s.request.messages);
  return r;
}

DetokenizeRequest parse_detokenize_request(std::string_view body) {
  const Json root = parse_object_body(body);
  DetokenizeRequest r;
  bool has_tokens = false;
  for (const auto& [key, value] : root.items()) {
    if (value.is_null()) continue;
    if (key == "model") {
      r.model = get_string(value, "model", "model");
    } else if (key == "tokens") {
      if (!value.is_array()) wrong_type("tokens", "an array of token ids", value, "tokens");
      for (size_t i = 0; i < value.size(); ++i) {
        r.tokens.push_back(parse_token_id(value[i], "tokens[" + std::to_string(i) + "]", "tokens"));
      }
      has_tokens = true;
    }
  }
  if (!has_tokens) throw invalid_request("'tokens' is required", "tokens");
  return r;
}

}  // namespace lazykv::api
