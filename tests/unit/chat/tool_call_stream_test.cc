// Tool calls streamed as they are written: names as soon as they are whole,
// arguments piece by piece, however the text is cut; text outside the form
// stops the stream and leaves the calls to the whole-reply parser.
#include "coordinator/chat/tool_call_stream.h"

#include <gtest/gtest.h>

#include <map>

#include "coordinator/chat/reply_text.h"

namespace lazykv {
namespace {

struct Streamed {
  std::map<int, std::string> names, arguments;
  int pieces = 0;
};

// Feeds `text` to a stream in pieces of `step` bytes, as a holder's text grows.
Streamed stream_in_pieces(ToolCallFormat format, const std::string& text, size_t step) {
  ToolCallStream stream(format);
  Streamed out;
  for (size_t end = std::min(step, text.size());; end = std::min(end + step, text.size())) {
    for (const ToolCallDelta& d : stream.push(std::string_view(text).substr(0, end))) {
      out.names[d.index] += d.name;
      out.arguments[d.index] += d.arguments;
      ++out.pieces;
    }
    if (end == text.size()) break;
  }
  return out;
}

TEST(ToolCallStream, HermesCallsHoweverTheTextIsCut) {
  const std::string text =
      " <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa\\\"ris\", \"days\": [1, {\"x\": \"}\"}]}}\n"
      "</tool_call>\n<tool_call>\n{\"name\":\"now\",\"parameters\":{}}\n</tool_call>";
  for (size_t step : {size_t(1), size_t(2), size_t(7), text.size()}) {
    Streamed s = stream_in_pieces(ToolCallFormat::kHermes, text, step);
    EXPECT_EQ(s.names, (std::map<int, std::string>{{0, "get_weather"}, {1, "now"}})) << step;
    EXPECT_EQ(s.arguments[0], R"({"city": "Pa\"ris", "days": [1, {"x": "}"}]})") << step;
    EXPECT_EQ(s.arguments[1], "{}") << step;
    if (step == 1) {
      EXPECT_GT(s.pieces, 40);  // the arguments arrive as they are written
    }
  }
}

TEST(ToolCallStream, Llama3CallsJoinedBySemicolons) {
  const std::string text = "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"n\": 1}}; {\"name\": \"b\", \"arguments\": {}}";
  Streamed s = stream_in_pieces(ToolCallFormat::kLlama3, text, 3);
  EXPECT_EQ(s.names, (std::map<int, std::string>{{0, "a"}, {1, "b"}}));
  EXPECT_EQ(s.arguments[0], R"({"n": 1})");
  EXPECT_EQ(s.arguments[1], "{}");
  EXPECT_EQ(stream_in_pieces(ToolCallFormat::kLlama3, "{\"name\": \"c\", \"parameters\": {}}", 1).names[0], "c");
}

TEST(ToolCallStream, TextOutsideTheFormStopsIt) {
  // Arguments before the name, an escaped name, text between calls.
  EXPECT_EQ(stream_in_pieces(ToolCallFormat::kHermes,
                             "<tool_call>{\"arguments\": {}, \"name\": \"f\"}</tool_call>", 1).pieces, 0);
  EXPECT_EQ(stream_in_pieces(ToolCallFormat::kHermes, "<tool_call>{\"name\": \"f\\u0041\"", 1).pieces, 0);
  const Streamed between = stream_in_pieces(
      ToolCallFormat::kHermes, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> and <tool_call>{\"name\": \"g\"", 1);
  EXPECT_EQ(between.names, (std::map<int, std::string>{{0, "f"}}));
}

// Through ReplyText: pieces while the reply streams; at the end every call,
// and how many of them began streaming (the rest are sent whole).
TEST(ToolCallStream, ReplyTextStreamsThenCountsWhatItStreamed) {
  ReplyText reply(ReasoningFormat::kNone, false, ToolCallFormat::kHermes);
  Streamed s;
  std::string content;
  for (const char* piece : {"Let me check. <tool", "_call>\n{\"name\": \"w\", \"argu", "ments\": {\"c\":", " 1}}\n</tool_call>"}) {
    ReplyPiece p = reply.push(piece);
    content += p.content;
    for (const ToolCallDelta& d : p.call_pieces) {
      s.names[d.index] += d.name;
      s.arguments[d.index] += d.arguments;
    }
  }
  const ReplyPiece last = reply.finish("");
  EXPECT_EQ(content + last.content, "Let me check.");
  EXPECT_EQ(s.names[0], "w");
  EXPECT_EQ(s.arguments[0], R"({"c": 1})");
  ASSERT_EQ(last.calls.size(), 1u);
  EXPECT_EQ(last.calls_streamed, 1);

  ReplyText odd(ReasoningFormat::kNone, false, ToolCallFormat::kHermes);
  odd.push("<tool_call>{\"arguments\": {\"c\": 2}, \"name\": \"w\"}");
  const ReplyPiece whole = odd.finish("</tool_call>");
  ASSERT_EQ(whole.calls.size(), 1u);  // parsed from the whole reply
  EXPECT_EQ(whole.calls_streamed, 0);  // so sent whole
}

}  // namespace
}  // namespace lazykv
