#include "coordinator/chat/tool_call_parser.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/chat/reply_text.h"

namespace lazykv {
namespace {

std::string read_template(const std::string& name) {
  std::ifstream in(std::string(LAZYKV_TEST_DATA_DIR) + "/chat/" + name);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_FALSE(text.str().empty()) << name;
  return text.str();
}

TEST(ToolCallParser, FormatFromTheTemplate) {
  EXPECT_EQ(tool_call_format_of_template(read_template("qwen2.5-instruct.jinja")), ToolCallFormat::kHermes);
  EXPECT_EQ(tool_call_format_of_template(read_template("qwen2.5-coder-instruct.jinja")), ToolCallFormat::kHermes);
  EXPECT_EQ(tool_call_format_of_template(read_template("llama3.2-instruct.jinja")), ToolCallFormat::kLlama3);
  EXPECT_EQ(tool_call_format_of_template(read_template("smollm2.jinja")), ToolCallFormat::kNone);
}

TEST(ToolCallParser, HermesCallsAndTheTextAroundThem) {
  const ParsedReply one = parse_tool_calls(
      ToolCallFormat::kHermes,
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n"
      "</tool_call>");
  EXPECT_EQ(one.content, "Let me look.");
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].name, "get_weather");
  EXPECT_EQ(one.calls[0].arguments, R"({"city":"Paris","days":2})");  // compact, in the model's key order

  const ParsedReply two = parse_tool_calls(ToolCallFormat::kHermes,
                                           "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n"
                                           "<tool_call>{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}");
  ASSERT_EQ(two.calls.size(), 2u);  // the last one cut off by the end of the reply
  EXPECT_EQ(two.calls[0].name, "a");
  EXPECT_EQ(two.calls[0].arguments, "{}");
  EXPECT_EQ(two.calls[1].arguments, R"({"x": 1})");  // arguments given as a string stay as written
  EXPECT_EQ(two.content, "");

  for (const char* not_a_call : {"no calls here", "<tool_call>{\"name\": \"a\", \"arguments\": {", "<tool_call>[1]",
                                 "<tool_call>{\"arguments\": {}}</tool_call>"}) {
    const ParsedReply p = parse_tool_calls(ToolCallFormat::kHermes, not_a_call);
    EXPECT_TRUE(p.calls.empty()) << not_a_call;
    EXPECT_EQ(p.content, not_a_call);  // left as the model wrote it
  }
}

TEST(ToolCallParser, Llama3JsonCalls) {
  const ParsedReply one =
      parse_tool_calls(ToolCallFormat::kLlama3, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}");
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].name, "get_weather");
  EXPECT_EQ(one.calls[0].arguments, R"({"city":"Oslo"})");
  const ParsedReply tagged = parse_tool_calls(
      ToolCallFormat::kLlama3, "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {}}");
  ASSERT_EQ(tagged.calls.size(), 2u);
  EXPECT_EQ(tagged.calls[1].name, "b");
  const ParsedReply semicolons = parse_tool_calls(
      ToolCallFormat::kLlama3, R"({"name": "q", "parameters": {"s": "a;b"}}; {"name": "r", "parameters": {}};)");
  ASSERT_EQ(semicolons.calls.size(), 2u);  // a ';' inside a string does not split, a trailing one is nothing
  EXPECT_EQ(semicolons.calls[0].arguments, R"({"s":"a;b"})");
  // Either key carries the arguments, whichever format the model was taught.
  EXPECT_EQ(parse_tool_calls(ToolCallFormat::kLlama3, R"({"name": "f", "arguments": {"x": 1}})").calls.at(0).arguments,
            R"({"x":1})");
  EXPECT_EQ(parse_tool_calls(ToolCallFormat::kHermes, R"(<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>)")
                .calls.at(0)
                .arguments,
            R"({"x":1})");
  EXPECT_EQ(parse_tool_calls(ToolCallFormat::kLlama3, "It is sunny.").content, "It is sunny.");
  EXPECT_TRUE(parse_tool_calls(ToolCallFormat::kLlama3, "{not json").calls.empty());
  EXPECT_TRUE(parse_tool_calls(ToolCallFormat::kNone, "<tool_call>{\"name\": \"a\"}</tool_call>").calls.empty());
}

// The holder passes content on until a call may begin; what it passes plus
// what it holds is the whole reply, however the reply is cut.
TEST(ToolCallParser, HolderPassesContentAndHoldsCallsAtEveryCut) {
  struct Case {
    ToolCallFormat format;
    std::string reply, passed;
  };
  const std::vector<Case> cases = {
      {ToolCallFormat::kHermes, "Sure. <tool_call>{\"name\": \"a\"}</tool_call>", "Sure."},
      {ToolCallFormat::kHermes, "a  b\n", "a  b"},  // trailing blanks wait for what follows
      {ToolCallFormat::kHermes, "a < b <tool", "a < b <tool"},  // not a call: the tail comes out at the end
      {ToolCallFormat::kLlama3, "  {\"name\": \"a\", \"parameters\": {}}", ""},
      {ToolCallFormat::kLlama3, "<|python_tag|>{}", ""},
      {ToolCallFormat::kLlama3, "Hello {x}", "Hello {x}"},
      {ToolCallFormat::kNone, "<tool_call>", "<tool_call>"},
  };
  for (const Case& c : cases) {
    for (size_t cut = 0; cut <= c.reply.size(); ++cut) {
      ToolCallHolder holder(c.format);
      std::string passed = holder.push(std::string_view(c.reply).substr(0, cut));
      passed += holder.push(std::string_view(c.reply).substr(cut));
      const std::string held = holder.take_held();
      EXPECT_EQ(passed + held, c.reply) << c.reply << " cut at " << cut;
      if (c.reply != "a < b <tool") {  // its tail may wait for the end, depending on the cut
        EXPECT_EQ(passed, c.passed) << c.reply << " cut at " << cut;
      }
    }
  }
}


// Tool turns reach a template as transformers passes them: the same text as
// the context written out by hand (arguments parsed into an object).
TEST(ToolCallParser, ToolTurnsRenderAsTransformersPassesThem) {
  const ChatTemplate qwen(read_template("qwen2.5-instruct.jinja"));
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type":"function","function":{"name":"get_weather","description":"Weather of a city",)"
      R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])");
  std::vector<ChatMessage> messages = {{"user", "Weather in Paris?"}, {"assistant", ""}, {"tool", "21 C"}};
  messages[1].tool_calls = {{"call_1", "get_weather", R"({"city": "Paris"})"}};
  messages[2].tool_call_id = "call_1";
  const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({"messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "21 C", "tool_call_id": "call_1"}],
      "tools": [], "add_generation_prompt": true, "bos_token": "", "eos_token": ""})");
  nlohmann::ordered_json with_tools = context;
  with_tools["tools"] = tools;
  const std::string rendered = qwen.render(messages, true, "", "", tools);
  EXPECT_EQ(rendered, qwen.render(with_tools));
  EXPECT_NE(rendered.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"),
            std::string::npos)
      << rendered;
  EXPECT_NE(rendered.find("<tool_response>\n21 C\n</tool_response>"), std::string::npos) << rendered;
  EXPECT_NE(rendered.find("\"name\": \"get_weather\""), std::string::npos);  // the tool's schema
  messages[1].tool_calls[0].arguments = "not json";  // passed on as text
  EXPECT_NE(qwen.render(messages, true, "", "", tools).find("\"arguments\": \"not json\""), std::string::npos);
}

// A reply through ReplyText: thinking, then content, then calls; a forced
// opening is part of the call the parser reads.
TEST(ToolCallParser, ReplyTextSplitsThinkingContentAndCalls) {
  ReplyText reply(ReasoningFormat::kThink, false, ToolCallFormat::kHermes);
  std::string reasoning, content;
  for (const char* piece : {"<think>need the ", "weather</think>\n\nChecking.", " <tool", "_call>\n{\"name\": \"w\", "}) {
    ReplyPiece p = reply.push(piece);
    reasoning += p.reasoning;
    content += p.content;
    EXPECT_TRUE(p.calls.empty());
  }
  ReplyPiece last = reply.finish("\"arguments\": {\"c\": 1}}\n</tool_call>");
  EXPECT_EQ(reasoning + last.reasoning, "need the weather");
  EXPECT_EQ(content + last.content, "Checking.");  // trimmed before the call
  ASSERT_EQ(last.calls.size(), 1u);
  EXPECT_EQ(last.calls[0].name, "w");
  EXPECT_EQ(last.calls[0].arguments, R"({"c":1})");

  ReplyText forced(ReasoningFormat::kNone, false, ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"w\", \"arguments\":");
  EXPECT_EQ(forced.push(" {\"c\": ").content, "");
  const ReplyPiece call = forced.finish("2}}\n</tool_call>");
  ASSERT_EQ(call.calls.size(), 1u);
  EXPECT_EQ(call.calls[0].arguments, R"({"c":2})");
  EXPECT_EQ(call.content, "");
  ReplyText broken(ReasoningFormat::kNone, false, ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"w\", \"arguments\":");
  EXPECT_EQ(broken.finish(" oops").content, "<tool_call>\n{\"name\": \"w\", \"arguments\": oops");  // as written
}

}  // namespace
}  // namespace lazykv
