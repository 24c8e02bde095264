// A reply that must call a tool: its opening, and the grammar its call
// follows (or none, when a tool's parameters are outside the subset).
#include "coordinator/server/forced_tool_call.h"

#include <gtest/gtest.h>

#include "coordinator/grammar/json_matcher.h"

namespace lazykv {
namespace {

api::GenerationRequest chat_with_tools(const std::string& tools, const std::string& choice) {
  return api::parse_generation_request(
      api::Endpoint::kChatCompletions,
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":)" + tools + R"(,"tool_choice":)" + choice + "}",
      {});
}

const std::string kTools =
    R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
    R"("properties":{"city":{"type":"string"}},"required":["city"]}}},)"
    R"({"type":"function","function":{"name":"set_room","parameters":{"$defs":{"room":{"enum":["hall","den"]}},)"
    R"("type":"object","properties":{"room":{"$ref":"#/$defs/room"}},"required":["room"]}}}])";

bool whole(const grammar::ResponseGrammar& g, const std::string& text) {
  const grammar::JsonMatcher m(*g.schema);
  grammar::MatchState state = m.start();
  return m.advance(state, text) && m.can_end(state);
}

TEST(ForcedToolCall, RequiredCallsFollowTheirFunctionsSchema) {
  const ForcedToolCall hermes = force_tool_call(ToolCallFormat::kHermes, chat_with_tools(kTools, R"("required")"));
  EXPECT_EQ(hermes.opening, "<tool_call>\n");
  ASSERT_NE(hermes.grammar.schema, nullptr);
  EXPECT_TRUE(whole(hermes.grammar, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"));
  EXPECT_TRUE(whole(hermes.grammar, R"({"arguments":{"room":"den"},"name":"set_room"})" "\n</tool_call>"));  // its $defs
  EXPECT_FALSE(whole(hermes.grammar, R"({"name":"set_room","arguments":{"room":"attic"}})" "\n</tool_call>"));
  EXPECT_FALSE(whole(hermes.grammar, R"({"name":"get_weather","arguments":{}})" "\n</tool_call>"));  // city is required
  EXPECT_FALSE(whole(hermes.grammar, R"({"name":"get_weather","arguments":{"city":"x"}})"));  // no closing tag

  const ForcedToolCall llama = force_tool_call(
      ToolCallFormat::kLlama3, chat_with_tools(kTools, R"({"type":"function","function":{"name":"set_room"}})"));
  EXPECT_EQ(llama.opening, "");
  ASSERT_NE(llama.grammar.schema, nullptr);
  EXPECT_TRUE(whole(llama.grammar, R"({"name":"set_room","parameters":{"room":"hall"}})"));
  EXPECT_FALSE(whole(llama.grammar, R"({"name":"get_weather","parameters":{"city":"x"}})"));  // not the named one
}

TEST(ForcedToolCall, OutsideTheSubsetTheOpeningAloneForcesTheCall) {
  const std::string tools = R"([{"type":"function","function":{"name":"mail","parameters":{"type":"object",)"
                            R"("properties":{"to":{"type":"string","format":"email"}}}}}])";
  const ForcedToolCall named = force_tool_call(
      ToolCallFormat::kHermes, chat_with_tools(tools, R"({"type":"function","function":{"name":"mail"}})"));
  EXPECT_EQ(named.grammar.schema, nullptr);
  EXPECT_EQ(named.opening, "<tool_call>\n{\"name\": \"mail\", \"arguments\":");
  EXPECT_EQ(force_tool_call(ToolCallFormat::kHermes, chat_with_tools(tools, R"("required")")).opening,
            "<tool_call>\n{\"name\": \"");
  EXPECT_EQ(force_tool_call(ToolCallFormat::kHermes, chat_with_tools(tools, R"("auto")")).opening, "");
  // "#" would point at the call's schema once the parameters sit inside it.
  const std::string recursive = R"([{"type":"function","function":{"name":"tree","parameters":{"type":"object",)"
                                R"("properties":{"child":{"$ref":"#"}}}}}])";
  EXPECT_EQ(force_tool_call(ToolCallFormat::kHermes, chat_with_tools(recursive, R"("required")")).grammar.schema,
            nullptr);
}

}  // namespace
}  // namespace lazykv
