#include "coordinator/api/openai_response.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace lazykv::api {
namespace {

using Json = nlohmann::ordered_json;

constexpr Endpoint kComp = Endpoint::kCompletions;
constexpr Endpoint kChat = Endpoint::kChatCompletions;

const ResponseMeta kMeta{"cmpl-abc", 1700000000, "smollm"};

std::vector<std::string> keys(const Json& object) {
  std::vector<std::string> out;
  for (const auto& [key, value] : object.items()) out.push_back(key);
  return out;
}

Choice simple_choice(int index, std::string text, std::string finish) {
  Choice c;
  c.index = index;
  c.text = std::move(text);
  c.finish_reason = std::move(finish);
  return c;
}

// "é" (C3 A9) generated as two byte tokens, then "!" — with alternatives.
std::vector<TokenLogprob> split_character_logprobs() {
  TokenLogprob first;
  first.token = "\xC3";
  first.logprob = -0.25f;
  first.top = {{"\xC3", -0.25f}, {"a", -2.5f}};
  first.text_offset = 0;
  TokenLogprob second;
  second.token = "\xA9";
  second.logprob = -0.5f;
  second.top = {{"\xA9", -0.5f}};
  second.text_offset = 1;
  TokenLogprob third;
  third.token = "!";
  third.logprob = -1.0f;
  third.top = {{"!", -1.0f}, {"?", -1.5f}};
  third.text_offset = 2;
  return {first, second, third};
}

TEST(OpenAiResponse, CompletionBody) {
  const std::vector<Choice> choices = {simple_choice(0, "Hello", "stop"), simple_choice(1, "Hi there", "length")};
  const Json body = Json::parse(completion_body(kComp, kMeta, choices, {7, 11, {}}));
  EXPECT_EQ(keys(body), (std::vector<std::string>{"id", "object", "created", "model", "choices", "usage",
                                                  "system_fingerprint"}));
  EXPECT_EQ(body["id"], "cmpl-abc");
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["created"], 1700000000);
  EXPECT_EQ(body["model"], "smollm");
  ASSERT_EQ(body["choices"].size(), 2u);
  const Json& c1 = body["choices"][1];
  EXPECT_EQ(keys(c1), (std::vector<std::string>{"index", "text", "logprobs", "finish_reason"}));
  EXPECT_EQ(c1["index"], 1);
  EXPECT_EQ(c1["text"], "Hi there");
  EXPECT_TRUE(c1["logprobs"].is_null());
  EXPECT_EQ(c1["finish_reason"], "length");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(body["usage"]["completion_tokens"], 11);
  EXPECT_EQ(body["usage"]["total_tokens"], 18);
}

TEST(OpenAiResponse, ChatBody) {
  const Json body = Json::parse(completion_body(kChat, kMeta, {simple_choice(0, "Sure.", "stop")}, {3, 2, {}}));
  EXPECT_EQ(body["object"], "chat.completion");
  const Json& choice = body["choices"][0];
  EXPECT_EQ(keys(choice), (std::vector<std::string>{"index", "message", "logprobs", "finish_reason"}));
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], "Sure.");
  EXPECT_TRUE(choice["message"]["refusal"].is_null());
  EXPECT_TRUE(choice["logprobs"].is_null());
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["total_tokens"], 5);
}

TEST(OpenAiResponse, ChatBodyWithReasoning) {
  Choice c = simple_choice(0, "4", "stop");
  c.reasoning = "2+2 is 4.";
  const Json body = Json::parse(completion_body(kChat, kMeta, {c}, {3, 9, 7}));
  const Json& message = body["choices"][0]["message"];
  EXPECT_EQ(message["content"], "4");
  EXPECT_EQ(message["reasoning_content"], "2+2 is 4.");
  EXPECT_EQ(body["usage"]["completion_tokens_details"], (Json{{"reasoning_tokens", 7}}));
  c.reasoning = "";  // a reply that did not think: null
  EXPECT_TRUE(Json::parse(completion_body(kChat, kMeta, {c}, {3, 1, 0}))["choices"][0]["message"]["reasoning_content"]
                  .is_null());
  // Without a reasoning parser neither field is there.
  const Json plain = Json::parse(completion_body(kChat, kMeta, {simple_choice(0, "4", "stop")}, {3, 1, {}}));
  EXPECT_FALSE(plain["choices"][0]["message"].contains("reasoning_content"));
  EXPECT_FALSE(plain["usage"].contains("completion_tokens_details"));
  ChunkDelta d;
  d.reasoning = "hmm";
  const Json chunk = Json::parse(chunk_body(kChat, kMeta, d, false));
  EXPECT_EQ(chunk["choices"][0]["delta"], (Json{{"reasoning_content", "hmm"}}));  // no empty content beside it
  d.text = "ok";
  d.reasoning.clear();
  EXPECT_EQ(Json::parse(chunk_body(kChat, kMeta, d, false))["choices"][0]["delta"], (Json{{"content", "ok"}}));
}

TEST(OpenAiResponse, ToolCallsWholeAndStreamed) {
  Choice c = simple_choice(0, "", "tool_calls");
  c.tool_calls = {{"call_1", "get_weather", R"({"city":"Paris"})"}, {"call_2", "get_time", "{}"}};
  const Json message = Json::parse(completion_body(kChat, kMeta, {c}, {3, 9, {}}))["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());  // as OpenAI, when the reply only calls tools
  EXPECT_EQ(message["tool_calls"][1], (Json{{"id", "call_2"}, {"type", "function"},
                                            {"function", {{"name", "get_time"}, {"arguments", "{}"}}}}));
  c.text = "Checking.";
  EXPECT_EQ(Json::parse(completion_body(kChat, kMeta, {c}, {3, 9, {}}))["choices"][0]["message"]["content"],
            "Checking.");
  // Streamed: a call's first piece has its id, type and name; later pieces only arguments.
  ChunkDelta d;
  d.tool_calls = {{0, "get_weather", "call_1", R"({"ci)"}, {1, "get_time", "call_2", "{}"}};
  Json delta = Json::parse(chunk_body(kChat, kMeta, d, false))["choices"][0]["delta"];
  EXPECT_FALSE(delta.contains("content"));
  ASSERT_EQ(delta["tool_calls"].size(), 2u);
  EXPECT_EQ(delta["tool_calls"][1], (Json{{"index", 1}, {"id", "call_2"}, {"type", "function"},
                                          {"function", {{"name", "get_time"}, {"arguments", "{}"}}}}));
  d.tool_calls = {{0, "", "", R"(ty":"Paris"})"}};
  delta = Json::parse(chunk_body(kChat, kMeta, d, false))["choices"][0]["delta"];
  EXPECT_EQ(delta["tool_calls"][0], (Json{{"index", 0}, {"function", {{"arguments", R"(ty":"Paris"})"}}}}));
}

TEST(OpenAiResponse, CompletionLogprobsWithASplitCharacter) {
  Choice c = simple_choice(0, "\xC3\xA9!", "stop");
  c.has_logprobs = true;
  c.logprobs = split_character_logprobs();
  const Json body = Json::parse(completion_body(kComp, kMeta, {c}, {1, 3, {}}));
  const Json& lp = body["choices"][0]["logprobs"];
  EXPECT_EQ(keys(lp), (std::vector<std::string>{"tokens", "token_logprobs", "top_logprobs", "text_offset"}));
  EXPECT_EQ(body["choices"][0]["text"], "\xC3\xA9!");
  EXPECT_EQ(lp["tokens"], (Json{"\xEF\xBF\xBD", "\xEF\xBF\xBD", "!"}));  // each half alone is U+FFFD
  EXPECT_EQ(lp["token_logprobs"], (Json{-0.25, -0.5, -1.0}));
  EXPECT_EQ(lp["text_offset"], (Json{0, 1, 2}));
  ASSERT_EQ(lp["top_logprobs"].size(), 3u);
  EXPECT_EQ(lp["top_logprobs"][0]["a"], -2.5);
  EXPECT_EQ(lp["top_logprobs"][0]["\xEF\xBF\xBD"], -0.25);
  EXPECT_EQ(lp["top_logprobs"][2]["?"], -1.5);
  EXPECT_EQ(lp["top_logprobs"][2].size(), 2u);
}

TEST(OpenAiResponse, ChatLogprobsKeepTheRawBytes) {
  Choice c = simple_choice(0, "\xC3\xA9!", "stop");
  c.has_logprobs = true;
  c.logprobs = split_character_logprobs();
  const Json body = Json::parse(completion_body(kChat, kMeta, {c}, {1, 3, {}}));
  const Json& lp = body["choices"][0]["logprobs"];
  EXPECT_EQ(keys(lp), (std::vector<std::string>{"content", "refusal"}));
  EXPECT_TRUE(lp["refusal"].is_null());
  ASSERT_EQ(lp["content"].size(), 3u);
  const Json& first = lp["content"][0];
  EXPECT_EQ(keys(first), (std::vector<std::string>{"token", "logprob", "bytes", "top_logprobs"}));
  EXPECT_EQ(first["token"], "\xEF\xBF\xBD");
  EXPECT_EQ(first["bytes"], (Json{0xC3}));
  EXPECT_EQ(lp["content"][1]["bytes"], (Json{0xA9}));
  EXPECT_EQ(first["logprob"], -0.25);
  ASSERT_EQ(first["top_logprobs"].size(), 2u);
  EXPECT_EQ(first["top_logprobs"][1]["token"], "a");
  EXPECT_EQ(first["top_logprobs"][1]["bytes"], (Json{'a'}));
  EXPECT_EQ(first["top_logprobs"][1]["logprob"], -2.5);
  EXPECT_EQ(lp["content"][2]["token"], "!");
}

TEST(OpenAiResponse, LogprobsAreShortAndFinite) {
  Choice c = simple_choice(0, "ab", "stop");
  c.has_logprobs = true;
  TokenLogprob a;
  a.token = "a";
  a.logprob = -0.1f;
  TokenLogprob b;
  b.token = "b";
  b.logprob = -std::numeric_limits<float>::infinity();
  c.logprobs = {a, b};
  const std::string text = completion_body(kComp, kMeta, {c}, {});
  EXPECT_NE(text.find("-0.1,"), std::string::npos) << text;  // not -0.10000000149011612
  const Json body = Json::parse(text);
  EXPECT_EQ(body["choices"][0]["logprobs"]["token_logprobs"][1], -9999.0);
}

TEST(OpenAiResponse, CompletionChunks) {
  ChunkDelta delta;
  delta.index = 2;
  delta.text = "wor";
  Json chunk = Json::parse(chunk_body(kComp, kMeta, delta, false));
  EXPECT_EQ(chunk["object"], "text_completion");
  EXPECT_FALSE(chunk.contains("usage"));
  ASSERT_EQ(chunk["choices"].size(), 1u);
  EXPECT_EQ(keys(chunk["choices"][0]), (std::vector<std::string>{"index", "text", "logprobs", "finish_reason"}));
  EXPECT_EQ(chunk["choices"][0]["index"], 2);
  EXPECT_EQ(chunk["choices"][0]["text"], "wor");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());

  delta.text = "\xC3";
  delta.has_logprobs = true;
  delta.logprobs = {split_character_logprobs()[0]};
  delta.finish_reason = "length";
  chunk = Json::parse(chunk_body(kComp, kMeta, delta, true));
  EXPECT_TRUE(chunk.contains("usage"));
  EXPECT_TRUE(chunk["usage"].is_null());
  EXPECT_EQ(chunk["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["tokens"], (Json{"\xEF\xBF\xBD"}));
  EXPECT_EQ(chunk["choices"][0]["text"], "\xEF\xBF\xBD");  // never invalid JSON text
}

TEST(OpenAiResponse, ChatChunks) {
  ChunkDelta first;
  first.first_of_choice = true;
  Json chunk = Json::parse(chunk_body(kChat, kMeta, first, true));
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["id"], "cmpl-abc");
  EXPECT_TRUE(chunk["usage"].is_null());
  const Json& c0 = chunk["choices"][0];
  EXPECT_EQ(keys(c0), (std::vector<std::string>{"index", "delta", "logprobs", "finish_reason"}));
  EXPECT_EQ(c0["delta"], (Json{{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(c0["finish_reason"].is_null());

  ChunkDelta middle;
  middle.text = "Hel";
  middle.has_logprobs = true;
  middle.logprobs = {split_character_logprobs()[2]};
  chunk = Json::parse(chunk_body(kChat, kMeta, middle, false));
  EXPECT_FALSE(chunk.contains("usage"));
  EXPECT_EQ(chunk["choices"][0]["delta"], (Json{{"content", "Hel"}}));
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["content"][0]["token"], "!");

  ChunkDelta last;
  last.index = 1;
  last.finish_reason = "stop";
  chunk = Json::parse(chunk_body(kChat, kMeta, last, false));
  EXPECT_EQ(chunk["choices"][0]["index"], 1);
  EXPECT_TRUE(chunk["choices"][0]["delta"].is_object());
  EXPECT_TRUE(chunk["choices"][0]["delta"].empty());
  EXPECT_EQ(chunk["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(chunk["choices"][0]["logprobs"].is_null());
}

TEST(OpenAiResponse, UsageChunk) {
  for (const Endpoint endpoint : {kComp, kChat}) {
    const Json chunk = Json::parse(usage_chunk_body(endpoint, kMeta, {4, 6, {}}));
    EXPECT_EQ(chunk["object"], endpoint == kChat ? "chat.completion.chunk" : "text_completion");
    EXPECT_TRUE(chunk["choices"].is_array());
    EXPECT_TRUE(chunk["choices"].empty());
    EXPECT_EQ(chunk["usage"], (Json{{"prompt_tokens", 4}, {"completion_tokens", 6}, {"total_tokens", 10}}));
  }
}

TEST(OpenAiResponse, ModelsBody) {
  const Json body = Json::parse(models_body({{"a", 2048}, {"b", 8192}}, 123));
  EXPECT_EQ(body["object"], "list");
  ASSERT_EQ(body["data"].size(), 2u);
  EXPECT_EQ(body["data"][1], (Json{{"id", "b"}, {"object", "model"}, {"created", 123}, {"owned_by", "lazykv"},
                                   {"max_model_len", 8192}}));
  EXPECT_EQ(Json::parse(models_body({}, 0))["data"], Json::array());
  EXPECT_EQ(Json::parse(model_body({"b", 8192}, 123)), body["data"][1]);
  // A model named after a file whose name is not UTF-8 still gets valid JSON.
  EXPECT_EQ(Json::parse(model_body({"m\xff", 1}, 1))["id"], "m\xef\xbf\xbd");
}

TEST(OpenAiResponse, TokenizeAndDetokenizeBodies) {
  const std::vector<std::string> strs = {"he", "llo"};
  EXPECT_EQ(Json::parse(tokenize_body({7, 9}, 4096, &strs)),
            (Json{{"count", 2}, {"max_model_len", 4096}, {"tokens", {7, 9}}, {"token_strs", {"he", "llo"}}}));
  EXPECT_TRUE(Json::parse(tokenize_body({}, 4096, nullptr))["token_strs"].is_null());
  EXPECT_EQ(Json::parse(tokenize_body({}, 4096, nullptr))["count"], 0);
  EXPECT_EQ(Json::parse(detokenize_body("hello"))["prompt"], "hello");
}

TEST(OpenAiResponse, ErrorBody) {
  Json body = Json::parse(error_body(invalid_request("'n' must be at least 1", "n")));
  EXPECT_EQ(keys(body["error"]), (std::vector<std::string>{"message", "type", "param", "code"}));
  EXPECT_EQ(body["error"]["message"], "'n' must be at least 1");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "n");
  EXPECT_TRUE(body["error"]["code"].is_null());

  body = Json::parse(error_body(ApiError(503, "server_error", "busy \xFF", "", "overloaded")));
  EXPECT_TRUE(body["error"]["param"].is_null());
  EXPECT_EQ(body["error"]["code"], "overloaded");
  EXPECT_EQ(body["error"]["message"], "busy \xEF\xBF\xBD");
}

TEST(OpenAiResponse, ParseErrorsFormatAsValidJson) {
  // The parser's message quotes the bytes it read last; the error body must stay valid JSON.
  try {
    parse_generation_request(kComp, "{\"model\":\"\xFF\xFE\"}", {});
    FAIL() << "accepted invalid UTF-8";
  } catch (const ApiError& e) {
    const Json body = Json::parse(error_body(e));
    EXPECT_NE(body["error"]["message"].get<std::string>().find("UTF-8"), std::string::npos);
  }
}

}  // namespace
}  // namespace lazykv::api
