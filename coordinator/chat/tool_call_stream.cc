#include "coordinator/chat/tool_call_stream.h"

#include "coordinator/chat/reply_scan.h"

namespace lazykv {
namespace {

constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

}  // namespace

std::vector<ToolCallDelta> ToolCallStream::push(std::string_view held) {
  std::vector<ToolCallDelta> out;
  for (; read_ < held.size() && step_ != Step::kStopped; ++read_) take(uint8_t(held[read_]), out);
  return out;
}

bool ToolCallStream::literal(uint8_t b, std::string_view expected) {
  if (matched_ == 0 && is_reply_space(char(b))) return false;
  if (uint8_t(expected[matched_]) != b) {
    stop();
    return false;
  }
  if (++matched_ < expected.size()) return false;
  matched_ = 0;
  return true;
}

void ToolCallStream::take(uint8_t b, std::vector<ToolCallDelta>& out) {
  const auto next = [&](Step s) { step_ = s; };
  switch (step_) {
    case Step::kOpen:
      if (format_ == ToolCallFormat::kHermes) {
        if (literal(b, kCallOpen)) next(Step::kBrace);
      } else if (matched_ > 0 || b == '<') {  // llama3: the tag is optional
        if (literal(b, kPythonTag)) next(Step::kBrace);
      } else if (!is_reply_space(char(b))) {
        next(Step::kBrace);
        take(b, out);
      }
      return;
    case Step::kBrace:
      if (literal(b, "{")) next(Step::kNameKey);
      return;
    case Step::kNameKey:
      if (literal(b, "\"name\"")) next(Step::kNameColon);
      return;
    case Step::kNameColon:
      if (literal(b, ":")) next(Step::kNameQuote);
      return;
    case Step::kNameQuote:
      if (literal(b, "\"")) {
        token_.clear();
        next(Step::kName);
      }
      return;
    case Step::kName:
      if (b == '\\' || b < 0x20) return stop();  // escapes: left to the whole-reply parser
      if (b != '"') {
        token_ += char(b);
        return;
      }
      out.push_back({calls_started_++, token_, "", ""});
      return next(Step::kComma);
    case Step::kComma:
      if (literal(b, ",")) {
        token_.clear();
        next(Step::kArgsKey);
      }
      return;
    case Step::kArgsKey:
      // "arguments" or "parameters", whichever the model wrote.
      if (token_.empty() && is_reply_space(char(b))) return;
      token_ += char(b);
      if (token_ == "\"arguments\"" || token_ == "\"parameters\"") return next(Step::kArgsColon);
      if (std::string_view("\"arguments\"").starts_with(token_) || std::string_view("\"parameters\"").starts_with(token_)) return;
      return stop();
    case Step::kArgsColon:
      if (literal(b, ":")) {
        arguments_ = JsonNesting{};
        next(Step::kArgs);
      }
      return;
    case Step::kArgs: {
      if (arguments_.depth == 0 && is_reply_space(char(b))) return;
      if (arguments_.depth == 0 && b != '{') return stop();  // arguments are an object
      arguments_.take(char(b));
      if (out.empty() || out.back().index != calls_started_ - 1) out.push_back({calls_started_ - 1, "", "", ""});
      out.back().arguments += char(b);
      if (arguments_.depth == 0) next(Step::kCloseBrace);
      return;
    }
    case Step::kCloseBrace:
      if (literal(b, "}")) next(Step::kAfterCall);
      return;
    case Step::kAfterCall:
      if (format_ == ToolCallFormat::kHermes) {
        if (literal(b, kCallClose)) next(Step::kOpen);
      } else if (literal(b, ";")) {
        next(Step::kBrace);
      }
      return;
    case Step::kStopped:
      return;
  }
}

}  // namespace lazykv
