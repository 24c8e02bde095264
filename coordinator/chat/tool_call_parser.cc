#include "coordinator/chat/tool_call_parser.h"

#include <nlohmann/json.hpp>
#include <optional>

#include "common/bounded_json.h"
#include "coordinator/chat/reply_scan.h"

namespace lazykv {

namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

// {"name": ..., "arguments" or "parameters": {...}} as a call (models trained
// on one format write the other's key too); nullopt when it is not one.
std::optional<ToolCall> call_of(std::string_view text) {
  Json j;
  try {
    j = parse_bounded_json<Json>(trim_reply_space(text));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  ToolCall call;
  call.name = j["name"].get<std::string>();
  auto arguments = j.find("arguments");
  if (arguments == j.end()) arguments = j.find("parameters");
  if (arguments == j.end() || arguments->is_null()) {
    call.arguments = "{}";
  } else if (arguments->is_string()) {
    call.arguments = arguments->get<std::string>();  // already JSON text
  } else if (arguments->is_object()) {
    call.arguments = arguments->dump(-1, ' ', false, Json::error_handler_t::replace);
  } else {
    return std::nullopt;
  }
  return call;
}

// `text` cut at each `separator` outside JSON strings and brackets.
std::vector<std::string_view> split_top_level(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  JsonNesting nesting;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == separator && nesting.at_top()) {
      parts.push_back(text.substr(start, i - start));
      start = i + 1;
    }
    nesting.take(c);
  }
  parts.push_back(text.substr(start));
  return parts;
}

ParsedReply parse_hermes(std::string_view reply) {
  ParsedReply out;
  std::string content;
  size_t pos = 0;
  while (pos < reply.size()) {
    const size_t open = reply.find(kCallOpen, pos);
    if (open == std::string_view::npos) {
      content += reply.substr(pos);
      break;
    }
    content += reply.substr(pos, open - pos);
    const size_t body = open + kCallOpen.size();
    const size_t close = reply.find(kCallClose, body);  // the last call may end at the end of the reply
    std::optional<ToolCall> call = call_of(reply.substr(body, close == std::string_view::npos ? close : close - body));
    if (!call) return {std::string(reply), {}};
    out.calls.push_back(std::move(*call));
    pos = close == std::string_view::npos ? reply.size() : close + kCallClose.size();
  }
  out.content = out.calls.empty() ? std::string(reply) : std::string(trim_reply_space(content));
  return out;
}

ParsedReply parse_llama3(std::string_view reply) {
  std::string_view text = trim_reply_space(reply);
  if (text.starts_with(kPythonTag)) text = trim_reply_space(text.substr(kPythonTag.size()));
  if (!text.starts_with('{')) return {std::string(reply), {}};
  // One call, or several joined by ';' (between objects, not inside strings).
  ParsedReply out;
  for (std::string_view part : split_top_level(text, ';')) {
    if (trim_reply_space(part).empty()) continue;  // a trailing ';'
    std::optional<ToolCall> call = call_of(part);
    if (!call) return {std::string(reply), {}};
    out.calls.push_back(std::move(*call));
  }
  if (out.calls.empty()) return {std::string(reply), {}};
  return out;
}

}  // namespace

ToolCallFormat tool_call_format_of_template(std::string_view source) {
  if (source.find(kCallOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (source.find("\"parameters\"") != std::string_view::npos && source.find("ipython") != std::string_view::npos) {
    return ToolCallFormat::kLlama3;
  }
  return ToolCallFormat::kNone;
}

ParsedReply parse_tool_calls(ToolCallFormat format, std::string_view reply) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return parse_hermes(reply);
    case ToolCallFormat::kLlama3:
      return parse_llama3(reply);
    case ToolCallFormat::kNone:
      break;
  }
  return {std::string(reply), {}};
}

std::string ToolCallHolder::push(std::string_view text) {
  if (holding_ || format_ == ToolCallFormat::kNone) {
    if (!holding_) return std::string(text);
    held_ += text;
    return "";
  }
  std::string buffer = std::move(held_);
  buffer += text;
  held_.clear();
  if (format_ == ToolCallFormat::kHermes) {
    size_t open = buffer.find(kCallOpen);
    if (open != std::string::npos) {
      while (open > 0 && is_reply_space(buffer[open - 1])) --open;
      held_ = buffer.substr(open);
      holding_ = true;
      return buffer.substr(0, open);
    }
    // Held too: a marker's start, and the blank space before it (content
    // that ends in a call is trimmed).
    size_t keep = marker_prefix_at_end(buffer, kCallOpen);
    while (keep < buffer.size() && is_reply_space(buffer[buffer.size() - keep - 1])) ++keep;
    held_ = buffer.substr(buffer.size() - keep);
    return buffer.substr(0, buffer.size() - keep);
  }
  // llama3: the reply is a call when its first text is '{' or <|python_tag|>.
  if (seen_text_) return buffer;
  const std::string_view rest = trim_reply_space(buffer);
  if (rest.empty()) {
    held_ = std::move(buffer);
    return "";
  }
  if (rest.front() == '{' || rest.starts_with(kPythonTag) || kPythonTag.starts_with(rest)) {
    if (kPythonTag.starts_with(rest) && rest.size() < kPythonTag.size()) {
      held_ = std::move(buffer);  // not decided yet
      return "";
    }
    holding_ = true;
    held_ = std::move(buffer);
    return "";
  }
  seen_text_ = true;
  return buffer;
}

std::string ToolCallHolder::take_held() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace lazykv
