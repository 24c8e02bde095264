#include "coordinator/api/openai_request.h"

#include <gtest/gtest.h>

#include <tuple>

#include <string>
#include <vector>

#include "common/utf8.h"

namespace lazykv::api {
namespace {

constexpr Endpoint kComp = Endpoint::kCompletions;
constexpr Endpoint kChat = Endpoint::kChatCompletions;

// A valid completions / chat body with extra top-level fields appended.
std::string comp(const std::string& extra = "") {
  return R"({"model":"m","prompt":"hi")" + (extra.empty() ? "" : "," + extra) + "}";
}
std::string chat(const std::string& extra = "") {
  return R"({"model":"m","messages":[{"role":"user","content":"hi"}])" + (extra.empty() ? "" : "," + extra) + "}";
}

GenerationRequest parse(Endpoint endpoint, const std::string& body, const RequestLimits& limits = {}) {
  return parse_generation_request(endpoint, body, limits);
}

// The ApiError parsing `body` throws (a failure if it throws none).
ApiError rejection(Endpoint endpoint, const std::string& body, const RequestLimits& limits = {}) {
  try {
    parse_generation_request(endpoint, body, limits);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "", "");
}

TEST(OpenAiRequest, InvalidRequestIs400) {
  const ApiError e = invalid_request("bad", "n", "some_code");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_STREQ(e.what(), "bad");
  EXPECT_EQ(e.param, "n");
  EXPECT_EQ(e.code, "some_code");
}

TEST(OpenAiRequest, MinimalCompletionsDefaults) {
  const GenerationRequest r = parse(kComp, comp());
  EXPECT_EQ(r.endpoint, kComp);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "hi");
  EXPECT_FALSE(r.prompts[0].is_tokens);
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FLOAT_EQ(r.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.top_p, 1.0f);
  EXPECT_EQ(r.top_k, 0);
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.logprobs);
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_FALSE(r.kv_policy.has_value());
  EXPECT_TRUE(r.stop.empty());
  EXPECT_TRUE(r.ignored_fields.empty());
  EXPECT_TRUE(r.messages.empty());
}

TEST(OpenAiRequest, EveryCompletionsField) {
  const GenerationRequest r = parse(
      kComp, comp(R"("max_tokens":32,"temperature":0.5,"top_p":0.9,"top_k":40,"min_p":0.05,"ignore_eos":true,"seed":7,)"
                  R"("stop":["\n","","END"],"n":2,"best_of":2,"stream":true,"stream_options":{"include_usage":true},)"
                  R"("logprobs":3,"echo":false,"presence_penalty":0.5,"frequency_penalty":-1.5,)"
                  R"("logit_bias":{"7":-100,"0":2.5},)"
                  R"("repetition_penalty":1.2,"min_tokens":4,)"
                  R"("user":"u1","suffix":"","kv_policy":{"name":"lazy","budget":256,"window":64})"));
  EXPECT_EQ(r.max_tokens, 32);
  EXPECT_FLOAT_EQ(r.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_FLOAT_EQ(r.min_p, 0.05f);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.seed, 7u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_EQ(r.user, "u1");
  EXPECT_FLOAT_EQ(r.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.frequency_penalty, -1.5f);
  EXPECT_FLOAT_EQ(r.repetition_penalty, 1.2f);
  EXPECT_EQ(r.logit_bias, (std::vector<std::pair<int32_t, float>>{{7, -100.0f}, {0, 2.5f}}));  // the body's order
  EXPECT_EQ(r.min_tokens, 4);
  ASSERT_TRUE(r.kv_policy.has_value());
  EXPECT_EQ(r.kv_policy->name, "lazy");
  EXPECT_EQ(r.kv_policy->get_int("budget"), 256);
  EXPECT_EQ(r.kv_policy->get_int("window"), 64);
  EXPECT_TRUE(r.ignored_fields.empty());
}

TEST(OpenAiRequest, EveryChatField) {
  const GenerationRequest r = parse(
      kChat, chat(R"("max_completion_tokens":10,"temperature":0,"logprobs":true,"top_logprobs":20,"stop":"###",)"
                  R"("seed":-1,"stream":false,"response_format":{"type":"text"},"tools":[],"tool_choice":"none",)"
                  R"("metadata":{"a":"b"},"store":false,"service_tier":"auto","parallel_tool_calls":true,)"
                  R"("modalities":["text"],"reasoning_effort":"low","stream_options":null)"));
  EXPECT_EQ(r.endpoint, kChat);
  EXPECT_EQ(r.max_tokens, 10);
  EXPECT_FLOAT_EQ(r.temperature, 0.0f);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 20);
  EXPECT_EQ(r.stop, std::vector<std::string>{"###"});
  EXPECT_EQ(r.seed, ~uint64_t(0));  // -1 as the same 64 bits
  EXPECT_FALSE(r.include_usage);
  EXPECT_TRUE(r.ignored_fields.empty());  // known harmless fields are silent
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].role, "user");
  EXPECT_EQ(r.messages[0].content, "hi");
}

struct PromptCase {
  const char* prompt;
  std::vector<std::string> texts;               // one per prompt, text prompts
  std::vector<std::vector<int32_t>> token_ids;  // one per prompt, token prompts
};

TEST(OpenAiRequest, EveryPromptForm) {
  const PromptCase cases[] = {
      {R"("hello")", {"hello"}, {}},
      {R"(["a","b","c"])", {"a", "b", "c"}, {}},
      {R"([1,2,3])", {}, {{1, 2, 3}}},
      {R"([1.0,0])", {}, {{1, 0}}},  // an integral float counts as an integer
      {R"([[1,2],[3]])", {}, {{1, 2}, {3}}},
      {R"("h\u00e9\ud83d\ude00")", {"h\xC3\xA9\xF0\x9F\x98\x80"}, {}},
  };
  for (const PromptCase& c : cases) {
    SCOPED_TRACE(c.prompt);
    const GenerationRequest r = parse(kComp, std::string(R"({"model":"m","prompt":)") + c.prompt + "}");
    if (!c.texts.empty()) {
      ASSERT_EQ(r.prompts.size(), c.texts.size());
      for (size_t i = 0; i < c.texts.size(); ++i) {
        EXPECT_FALSE(r.prompts[i].is_tokens);
        EXPECT_EQ(r.prompts[i].text, c.texts[i]);
      }
    } else {
      ASSERT_EQ(r.prompts.size(), c.token_ids.size());
      for (size_t i = 0; i < c.token_ids.size(); ++i) {
        EXPECT_TRUE(r.prompts[i].is_tokens);
        EXPECT_EQ(r.prompts[i].tokens, c.token_ids[i]);
      }
    }
  }
}

TEST(OpenAiRequest, PromptCountLimit) {
  RequestLimits limits;
  limits.max_prompts = 2;
  EXPECT_EQ(parse(kComp, R"({"model":"m","prompt":["a","b"]})", limits).prompts.size(), 2u);
  const ApiError e = rejection(kComp, R"({"model":"m","prompt":["a","b","c"]})", limits);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "prompt");
  EXPECT_NE(std::string(e.what()).find("2"), std::string::npos) << e.what();
  EXPECT_EQ(rejection(kComp, R"({"model":"m","prompt":[[1],[2],[3]]})", limits).param, "prompt");
  limits.max_prompts = 0;  // no limit
  EXPECT_EQ(parse(kComp, R"({"model":"m","prompt":["a","b","c"]})", limits).prompts.size(), 3u);
}

TEST(OpenAiRequest, EveryMessageForm) {
  const GenerationRequest r = parse(kChat, R"({"model":"m","messages":[
      {"role":"system","content":"sys"},
      {"role":"developer","content":"dev"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"name":"bob"},
      {"role":"assistant","content":null},
      {"role":"assistant"},
      {"role":"assistant","content":"", "refusal":null, "tool_calls":[]},
      {"role":"tool","content":"42","tool_call_id":"x"},
      {"role":"user","content":[]}]})");
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"system", "sys"},  {"system", "dev"}, {"user", "ab"}, {"assistant", ""},
      {"assistant", ""}, {"assistant", ""}, {"tool", "42"}, {"user", ""}};
  ASSERT_EQ(r.messages.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(r.messages[i].role, expected[i].first) << i;
    EXPECT_EQ(r.messages[i].content, expected[i].second) << i;
  }
}

TEST(OpenAiRequest, EveryStopForm) {
  struct StopCase {
    const char* stop;
    std::vector<std::string> expected;
  };
  const StopCase cases[] = {
      {"null", {}},
      {R"("")", {}},
      {R"("x")", {"x"}},
      {"[]", {}},
      {R"(["a","","b"])", {"a", "b"}},
      {R"(["1","2","3","4"])", {"1", "2", "3", "4"}},
  };
  for (const StopCase& c : cases) {
    SCOPED_TRACE(c.stop);
    EXPECT_EQ(parse(kComp, comp(std::string(R"("stop":)") + c.stop)).stop, c.expected);
    EXPECT_EQ(parse(kChat, chat(std::string(R"("stop":)") + c.stop)).stop, c.expected);
  }
}

TEST(OpenAiRequest, LogitBiasEntryLimit) {
  std::string bias;
  for (int id = 0; id < 1025; ++id) {
    if (id > 0) bias += ',';
    bias += '"';
    bias += std::to_string(id);
    bias += "\":-1";
  }
  try {
    parse(kComp, comp(R"("logit_bias":{)" + bias + "}"));
    FAIL() << "1025 logit_bias entries were accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "logit_bias");
    EXPECT_NE(std::string(e.what()).find("at most 1024"), std::string::npos) << e.what();
  }
  const std::string fits = bias.substr(0, bias.rfind(','));
  EXPECT_EQ(parse(kComp, comp(R"("logit_bias":{)" + fits + "}")).logit_bias.size(), 1024u);
  // Two spellings of one id: the later one holds, as in a dict.
  EXPECT_EQ(parse(kComp, comp(R"("logit_bias":{"5":-100,"05":100,"7":1})")).logit_bias,
            (std::vector<std::pair<int32_t, float>>{{5, 100.0f}, {7, 1.0f}}));
}

TEST(OpenAiRequest, TokenizeAndDetokenizeBodies) {
  TokenizeRequest t = parse_tokenize_request(R"({"model":"m","prompt":"hi","add_special_tokens":false,"x":1})");
  EXPECT_EQ(t.model, "m");
  EXPECT_EQ(t.prompt, "hi");
  EXPECT_FALSE(t.add_special_tokens);
  EXPECT_FALSE(t.return_token_strs);
  t = parse_tokenize_request(R"({"messages":[{"role":"user","content":"hi"}],"return_token_strs":true})");
  ASSERT_EQ(t.messages.size(), 1u);
  EXPECT_EQ(t.messages[0].content, "hi");
  EXPECT_FALSE(t.prompt.has_value());
  EXPECT_TRUE(t.return_token_strs);
  EXPECT_EQ(parse_detokenize_request(R"({"tokens":[1,2,3]})").tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(parse_detokenize_request(R"({"tokens":[]})").tokens.empty());

  const std::vector<std::tuple<std::string, std::string, std::string>> tokenize_errors = {
      {R"({})", "prompt", "Exactly one of 'prompt' and 'messages'"},
      {R"({"prompt":"a","messages":[{"role":"user","content":"b"}]})", "prompt", "Exactly one"},
      {R"({"prompt":3})", "prompt", "'prompt' must be a string"},
      {R"({"messages":[]})", "messages", "must not be empty"},
      {R"({"prompt":"a","add_generation_prompt":false})", "add_generation_prompt", "not supported"},
      {R"({"prompt":"a","return_token_strs":"yes"})", "return_token_strs", "must be a boolean"},
      {R"([1])", "", "must be a JSON object"},
  };
  for (const auto& [body, param, part] : tokenize_errors) {
    try {
      parse_tokenize_request(body);
      ADD_FAILURE() << body << " was accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, param) << body;
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  }
  const std::vector<std::tuple<std::string, std::string>> detokenize_errors = {
      {R"({})", "'tokens' is required"},
      {R"({"tokens":"abc"})", "'tokens' must be an array of token ids"},
      {R"({"tokens":[1,-2]})", "'tokens[1]' is not a valid token id"},
      {R"({"tokens":[1.5]})", "'tokens[0]' must be an integer"},
  };
  for (const auto& [body, part] : detokenize_errors) {
    try {
      parse_detokenize_request(body);
      ADD_FAILURE() << body << " was accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, "tokens") << body;
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  }
}

TEST(OpenAiRequest, ToolsToolChoiceAndToolTurns) {
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"get_weather","description":"d",)"
                            R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])";
  GenerationRequest r = parse(kChat, chat(tools));
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0]["function"]["name"], "get_weather");
  EXPECT_EQ(r.tool_choice.mode, ToolChoice::Mode::kAuto);  // OpenAI's default with tools
  EXPECT_EQ(parse(kChat, chat()).tool_choice.mode, ToolChoice::Mode::kNone);
  EXPECT_EQ(parse(kChat, chat(R"("tool_choice":"none")")).tool_choice.mode, ToolChoice::Mode::kNone);
  EXPECT_EQ(parse(kChat, chat(tools + R"(,"tool_choice":"required")")).tool_choice.mode, ToolChoice::Mode::kRequired);
  r = parse(kChat, chat(tools + R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}})"));
  EXPECT_EQ(r.tool_choice.mode, ToolChoice::Mode::kFunction);
  EXPECT_EQ(r.tool_choice.function, "get_weather");

  r = parse(kChat, R"({"model":"m","messages":[{"role":"user","content":"hi"},)"
                   R"({"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",)"
                   R"("function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},)"
                   R"({"role":"tool","tool_call_id":"call_1","content":"21 C"}]})");
  ASSERT_EQ(r.messages.size(), 3u);
  ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[1].tool_calls[0].id, "call_1");
  EXPECT_EQ(r.messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(r.messages[2].tool_call_id, "call_1");
  EXPECT_EQ(r.messages[2].content, "21 C");
  for (const char* bad : {R"({"role":"user","content":"x","tool_calls":[{"function":{"name":"f"}}]})",
                          R"({"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]})",
                          R"({"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{}}}]})",
                          R"({"role":"assistant","function_call":{"name":"f"}})"}) {
    EXPECT_THROW(parse(kChat, std::string(R"({"model":"m","messages":[)") + bad + "]}"), ApiError) << bad;
  }
}

TEST(OpenAiRequest, StructuredOutputsCompileTheirSchema) {
  EXPECT_EQ(parse(kChat, chat()).response_grammar.schema, nullptr);
  EXPECT_EQ(parse(kChat, chat(R"("response_format":{"type":"text"})")).response_grammar.schema, nullptr);
  const GenerationRequest object = parse(kChat, chat(R"("response_format":{"type":"json_object"})"));
  ASSERT_NE(object.response_grammar.schema, nullptr);
  EXPECT_EQ(object.response_grammar.key, "json_object");
  // Property order does not change the key: one compiled constraint serves both.
  const std::string a = R"({"type":"object","properties":{"x":{"type":"integer"},"y":{"type":"string"}}})";
  const std::string b = R"({"properties":{"y":{"type":"string"},"x":{"type":"integer"}},"type":"object"})";
  const auto with_schema = [&](const std::string& schema) {
    return parse(kChat, chat(R"("response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,)"
                             R"("schema":)" + schema + "}}"));
  };
  const GenerationRequest ra = with_schema(a);
  ASSERT_NE(ra.response_grammar.schema, nullptr);
  EXPECT_EQ(ra.response_grammar.key, with_schema(b).response_grammar.key);
  EXPECT_EQ(ra.response_grammar.schema->nodes[size_t(ra.response_grammar.schema->root)].keys,
            (std::vector<std::string>{"x", "y"}));
  EXPECT_NE(parse(kComp, comp(R"("guided_json":{"type":"integer"})")).response_grammar.schema, nullptr);
  EXPECT_NE(parse(kComp, comp(R"("guided_json":"{\"type\":\"integer\"}")")).response_grammar.schema, nullptr);
  const GenerationRequest choice = parse(kComp, comp(R"("guided_choice":["yes","no"])"));
  ASSERT_NE(choice.response_grammar.schema, nullptr);
  EXPECT_EQ(choice.response_grammar.schema->nodes[0].literals, (std::vector<std::string>{"no", "yes"}));
}

TEST(OpenAiRequest, NullMeansUnset) {
  const GenerationRequest r = parse(
      kComp, comp(R"("max_tokens":null,"temperature":null,"top_p":null,"seed":null,"n":null,"stream":null,)"
                  R"("logprobs":null,"echo":null,"best_of":null,"logit_bias":null,"tools":null,"user":null,)"
                  R"("suffix":null,"kv_policy":null,"response_format":null)"));
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FLOAT_EQ(r.temperature, 1.0f);
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.logprobs);
  EXPECT_FALSE(r.kv_policy.has_value());
  EXPECT_TRUE(r.ignored_fields.empty());
}

TEST(OpenAiRequest, MaxTokensAndMaxCompletionTokens) {
  RequestLimits limits;
  limits.max_tokens_cap = 100;
  EXPECT_EQ(parse(kChat, chat(R"("max_tokens":5)"), limits).max_tokens, 5);
  EXPECT_EQ(parse(kChat, chat(R"("max_completion_tokens":6)"), limits).max_tokens, 6);
  // Both given: max_completion_tokens (the newer name) wins.
  EXPECT_EQ(parse(kChat, chat(R"("max_tokens":5,"max_completion_tokens":7)"), limits).max_tokens, 7);
  EXPECT_EQ(parse(kComp, comp(R"("max_tokens":100)"), limits).max_tokens, 100);
  const ApiError e = rejection(kComp, comp(R"("max_tokens":101)"), limits);
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_NE(std::string(e.what()).find("100"), std::string::npos) << e.what();  // states the cap
  EXPECT_EQ(rejection(kChat, chat(R"("max_completion_tokens":101)"), limits).param, "max_completion_tokens");
  // No cap: anything that fits in int32.
  EXPECT_EQ(parse(kComp, comp(R"("max_tokens":1000000)")).max_tokens, 1000000);
  EXPECT_EQ(rejection(kComp, comp(R"("max_tokens":1e12)")).param, "max_tokens");
}

TEST(OpenAiRequest, StreamOptions) {
  const GenerationRequest usage = parse(kChat, chat(R"("stream":true,"stream_options":{"include_usage":true})"));
  EXPECT_TRUE(usage.stream);
  EXPECT_TRUE(usage.include_usage);
  EXPECT_FALSE(parse(kComp, comp(R"("stream":true,"stream_options":{})")).include_usage);
  // Asking for nothing is harmless without streaming too; asking for usage is not.
  const GenerationRequest quiet = parse(kComp, comp(R"("stream_options":{"include_usage":false})"));
  EXPECT_FALSE(quiet.stream);
  EXPECT_FALSE(quiet.include_usage);
  EXPECT_TRUE(quiet.ignored_fields.empty());
  EXPECT_EQ(rejection(kComp, comp(R"("stream":false,"stream_options":{"include_usage":true})")).param,
            "stream_options");
}

TEST(OpenAiRequest, SeedAcceptsTheWholeInt64AndUint64Range) {
  EXPECT_EQ(parse(kComp, comp(R"("seed":0)")).seed, 0u);
  EXPECT_EQ(parse(kComp, comp(R"("seed":-9223372036854775808)")).seed, uint64_t(1) << 63);
  EXPECT_EQ(parse(kComp, comp(R"("seed":18446744073709551615)")).seed, ~uint64_t(0));
  EXPECT_EQ(parse(kComp, comp(R"("seed":5.0)")).seed, 5u);
  EXPECT_EQ(rejection(kComp, comp(R"("seed":1e30)")).param, "seed");
  EXPECT_EQ(rejection(kComp, comp(R"("seed":0.5)")).param, "seed");
}

TEST(OpenAiRequest, UnknownFieldsAreListedInOrder) {
  const GenerationRequest r =
      parse(kComp, R"({"zeta":1,"model":"m","alpha":{"x":[1,2]},"prompt":"p","messages":[],"top_logprobs":3})");
  // messages and top_logprobs belong to chat: unknown to completions.
  EXPECT_EQ(r.ignored_fields, (std::vector<std::string>{"zeta", "alpha", "messages", "top_logprobs"}));
  const GenerationRequest c = parse(kChat, chat(R"("prompt":"x","echo":true,"best_of":3,"suffix":"s","mystery":null)"));
  EXPECT_EQ(c.ignored_fields, (std::vector<std::string>{"prompt", "echo", "best_of", "suffix", "mystery"}));
  EXPECT_FALSE(c.echo);
}

TEST(OpenAiRequest, UnknownFieldNamesAreKeptShortFewAndPrintable) {
  // A 4 MB name is kept as its first 64 bytes; a newline or an escape
  // sequence in a name cannot forge a log line.
  std::string body = R"({"model":"m","prompt":"p",")" + std::string(4 << 20, 'x') + R"(":1,"a\nlazykv: forged\u001b[31m":2)";
  for (int i = 0; i < 100; ++i) body += ",\"f" + std::to_string(i) + "\":0";
  body += "}";
  const GenerationRequest r = parse(kComp, body);
  ASSERT_EQ(r.ignored_fields.size(), 16u);
  EXPECT_EQ(r.ignored_fields[0], std::string(64, 'x') + "...");
  EXPECT_EQ(r.ignored_fields[1], "a\\x0alazykv: forged\\x1b[31m");
  EXPECT_EQ(r.ignored_fields[15], "f13");
}

struct Rejection {
  Endpoint endpoint;
  std::string body;
  std::string param;
  std::string message_part;  // the message must contain this (names the field)
};

TEST(OpenAiRequest, EveryRejectionIs400WithParamAndMessage) {
  RequestLimits limits;
  limits.max_tokens_cap = 1000;
  limits.max_n = 4;
  limits.max_stop = 4;
  const Rejection cases[] = {
      // The body itself.
      {kComp, R"({"model":"m",)", "", "not valid JSON"},
      {kComp, "", "", "not valid JSON"},
      {kComp, R"(["model"])", "", "JSON object, got array"},
      {kChat, "42", "", "JSON object, got number"},
      {kComp, R"({"model":"m","prompt":"a","x":1e400})", "", "number too large"},
      // model
      {kComp, R"({"prompt":"a"})", "model", "'model'"},
      {kComp, R"({"model":"","prompt":"a"})", "model", "'model'"},
      {kChat, R"({"model":null,"messages":[{"role":"user","content":"a"}]})", "model", "'model'"},
      {kComp, R"({"model":5,"prompt":"a"})", "model", "'model' must be a string, got number 5"},
      // prompt
      {kComp, R"({"model":"m"})", "prompt", "'prompt' is required"},
      {kComp, R"({"model":"m","prompt":null})", "prompt", "'prompt' is required"},
      {kComp, R"({"model":"m","prompt":""})", "prompt", "'prompt' must not be empty"},
      {kComp, R"({"model":"m","prompt":[]})", "prompt", "'prompt' must not be empty"},
      {kComp, R"({"model":"m","prompt":["a",""]})", "prompt", "'prompt[1]' must not be empty"},
      {kComp, R"({"model":"m","prompt":[[1],[]]})", "prompt", "'prompt[1]' must not be empty"},
      {kComp, R"({"model":"m","prompt":["a",1]})", "prompt", "'prompt[1]'"},
      {kComp, R"({"model":"m","prompt":[1,"a"]})", "prompt", "'prompt[1]' must be an integer, got string"},
      {kComp, R"({"model":"m","prompt":[1,-2]})", "prompt", "'prompt[1]' is not a valid token id"},
      {kComp, R"({"model":"m","prompt":[1,4294967296]})", "prompt", "'prompt[1]' is not a valid token id"},
      {kComp, R"({"model":"m","prompt":[1.5]})", "prompt", "'prompt[0]' must be an integer, got number 1.5"},
      {kComp, R"({"model":"m","prompt":[[1],[2,true]]})", "prompt", "'prompt[1][1]' must be an integer"},
      {kComp, R"({"model":"m","prompt":{"a":1}})", "prompt", "'prompt' must be a string"},
      {kComp, R"({"model":"m","prompt":[{"a":1}]})", "prompt", "'prompt[0]'"},
      {kComp, R"({"model":"m","prompt":true})", "prompt", "got boolean"},
      // messages
      {kChat, R"({"model":"m"})", "messages", "'messages' is required"},
      {kChat, R"({"model":"m","messages":[]})", "messages", "'messages' must not be empty"},
      {kChat, R"({"model":"m","messages":"hi"})", "messages", "'messages' must be an array"},
      {kChat, R"({"model":"m","messages":["hi"]})", "messages[0]", "'messages[0]' must be an object, got string"},
      {kChat, R"({"model":"m","messages":[{"content":"a"}]})", "messages[0].role", "'messages[0].role' is required"},
      {kChat, R"({"model":"m","messages":[{"role":"bot","content":"a"}]})", "messages[0].role", "'bot'"},
      {kChat, R"({"model":"m","messages":[{"role":1,"content":"a"}]})", "messages[0].role", "must be a string"},
      {kChat, R"({"model":"m","messages":[{"role":"user"}]})", "messages[0].content",
       "'messages[0].content' is required"},
      {kChat, R"({"model":"m","messages":[{"role":"user","content":null}]})", "messages[0].content", "is required"},
      {kChat, R"({"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":7}]})",
       "messages[1].content", "'messages[1].content' must be a string or an array of content parts, got number 7"},
      {kChat,
       R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})",
       "messages[0].content", "'image_url' in 'messages[0].content[0]' is not supported"},
      {kChat, R"({"model":"m","messages":[{"role":"user","content":[{"text":"a"}]}]})", "messages[0].content",
       "'messages[0].content[0].type' is required"},
      {kChat, R"({"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]})", "messages[0].content",
       "'messages[0].content[0].text' is required"},
      {kChat, R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":3}]}]})",
       "messages[0].content", "'messages[0].content[0].text' must be a string"},
      {kChat, R"({"model":"m","messages":[{"role":"user","content":["a"]}]})", "messages[0].content",
       "'messages[0].content[0]' must be an object"},
      {kChat, R"({"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}]})",
       "messages[0].tool_calls", "'messages[0].tool_calls[0].function' must be an object"},
      // max_tokens
      {kComp, comp(R"("max_tokens":0)"), "max_tokens", "'max_tokens' must be at least 1"},
      {kChat, chat(R"("max_tokens":-5)"), "max_tokens", "'max_tokens' must be at least 1"},
      {kChat, chat(R"("max_completion_tokens":0)"), "max_completion_tokens", "'max_completion_tokens'"},
      {kComp, comp(R"("max_tokens":1001)"), "max_tokens", "at most 1000"},
      {kComp, comp(R"("max_tokens":"10")"), "max_tokens", "'max_tokens' must be an integer, got string"},
      {kComp, comp(R"("max_tokens":10.5)"), "max_tokens", "'max_tokens' must be an integer, got number 10.5"},
      {kComp, comp(R"("max_tokens":true)"), "max_tokens", "'max_tokens' must be an integer, got boolean"},
      // sampling
      {kComp, comp(R"("temperature":2.5)"), "temperature", "'temperature' must be between 0 and 2, got 2.5"},
      {kComp, comp(R"("temperature":-0.1)"), "temperature", "'temperature'"},
      {kComp, comp(R"("temperature":"hot")"), "temperature", "'temperature' must be a number, got string"},
      {kChat, chat(R"("temperature":true)"), "temperature", "'temperature' must be a number, got boolean"},
      {kComp, comp(R"("top_p":0)"), "top_p", "'top_p' must be greater than 0"},
      {kComp, comp(R"("top_p":1.01)"), "top_p", "'top_p'"},
      {kComp, comp(R"("top_k":-1)"), "top_k", "'top_k' must be at least 0"},
      {kComp, comp(R"("top_k":2.5)"), "top_k", "'top_k' must be an integer"},
      {kComp, comp(R"("min_p":1.5)"), "min_p", "'min_p' must be between 0 and 1"},
      {kComp, comp(R"("seed":"1")"), "seed", "'seed' must be an integer, got string"},
      // stop
      {kComp, comp(R"("stop":5)"), "stop", "'stop' must be a string or an array of strings, got number 5"},
      {kComp, comp(R"("stop":["a",1])"), "stop", "'stop[1]' must be a string"},
      {kChat, chat(R"("stop":["1","2","3","4","5"])"), "stop", "at most 4"},
      // n, best_of
      {kComp, comp(R"("n":0)"), "n", "'n' must be between 1 and 4, got 0"},
      {kComp, comp(R"("n":5)"), "n", "'n' must be between 1 and 4, got 5"},
      {kChat, chat(R"("n":"2")"), "n", "'n' must be an integer"},
      {kComp, comp(R"("best_of":3)"), "best_of", "'best_of'"},
      {kComp, comp(R"("best_of":2,"n":3)"), "best_of", "not supported"},
      {kComp, comp(R"("best_of":"x")"), "best_of", "'best_of' must be an integer"},
      // streaming
      {kComp, comp(R"("stream":1)"), "stream", "'stream' must be a boolean, got number 1"},
      {kComp, comp(R"("stream_options":{"include_usage":true})"), "stream_options", "'stream_options'"},
      {kChat, chat(R"("stream":false,"stream_options":{"include_usage":true})"), "stream_options", "'stream'"},
      {kChat, chat(R"("stream":true,"stream_options":true)"), "stream_options", "must be an object"},
      {kChat, chat(R"("stream":true,"stream_options":{"include_usage":"yes"})"), "stream_options.include_usage",
       "'stream_options.include_usage' must be a boolean"},
      // logprobs
      {kComp, comp(R"("logprobs":6)"), "logprobs", "'logprobs' must be between 0 and 5"},
      {kComp, comp(R"("logprobs":true)"), "logprobs", "'logprobs' must be an integer, got boolean"},
      {kChat, chat(R"("logprobs":1)"), "logprobs", "'logprobs' must be a boolean"},
      {kChat, chat(R"("logprobs":true,"top_logprobs":21)"), "top_logprobs", "'top_logprobs' must be between 0 and 20"},
      {kChat, chat(R"("top_logprobs":2)"), "top_logprobs", "'logprobs'"},
      {kChat, chat(R"("logprobs":false,"top_logprobs":2)"), "top_logprobs", "'top_logprobs' requires"},
      {kComp, comp(R"("echo":true,"logprobs":0)"), "echo", "not supported"},
      {kComp, comp(R"("echo":"yes")"), "echo", "'echo' must be a boolean"},
      // penalties, logit_bias, min_tokens
      {kChat, chat(R"("frequency_penalty":3)"), "frequency_penalty", "'frequency_penalty' must be between -2 and 2"},
      {kComp, comp(R"("presence_penalty":-2.5)"), "presence_penalty", "'presence_penalty' must be between -2 and 2"},
      {kComp, comp(R"("presence_penalty":"0")"), "presence_penalty", "must be a number"},
      {kComp, comp(R"("repetition_penalty":0)"), "repetition_penalty",
       "'repetition_penalty' must be between 0.01 and 100, got 0"},
      {kComp, comp(R"("repetition_penalty":1e-46)"), "repetition_penalty", "between 0.01 and 100"},
      {kChat, chat(R"("repetition_penalty":101)"), "repetition_penalty", "between 0.01 and 100, got 101"},
      {kComp, comp(R"("logit_bias":[1])"), "logit_bias", "'logit_bias' must be an object"},
      {kComp, comp(R"("logit_bias":{"x1":1})"), "logit_bias", "keys must be token ids"},
      {kComp, comp(R"("logit_bias":{"-3":1})"), "logit_bias", "keys must be token ids"},
      {kComp, comp(R"("logit_bias":{"99999999999":1})"), "logit_bias", "keys must be token ids"},
      {kComp, comp(R"("logit_bias":{"12 ":1})"), "logit_bias", "keys must be token ids"},
      {kChat, chat(R"("logit_bias":{"12":101})"), "logit_bias",
       "'logit_bias.12' must be between -100 and 100, got 101"},
      {kChat, chat(R"("logit_bias":{"12":"5"})"), "logit_bias", "'logit_bias.12' must be a number"},
      {kComp, comp(R"("min_tokens":-1)"), "min_tokens", "'min_tokens' must be at least 0"},
      {kComp, comp(R"("min_tokens":9,"max_tokens":8)"), "min_tokens",
       "'min_tokens' (9) must not exceed 'max_tokens' (8)"},
      {kChat, chat(R"("min_tokens":9,"max_completion_tokens":8)"), "min_tokens", "must not exceed"},
      // unsupported features
      {kComp, comp(R"("tools":[{"type":"function","function":{"name":"f"}}])"), "tools", "use chat"},
      {kChat, chat(R"("tools":{})"), "tools", "'tools' must be an array of tools"},
      {kChat, chat(R"("tools":[{"type":"retrieval"}])"), "tools", "Tools of type 'retrieval'"},
      {kChat, chat(R"("tools":[{"type":"function"}])"), "tools", "'tools[0].function' must be an object"},
      {kChat, chat(R"("tools":[{"type":"function","function":{"name":"a b"}}])"), "tools", "letters, digits"},
      {kChat, chat(R"("tools":[{"type":"function","function":{"name":"f","parameters":3}}])"), "tools",
       "'tools[0].function.parameters' must be a JSON Schema object"},
      {kChat,
       chat(R"("tools":[{"type":"function","function":{"name":"f"}},)"
            R"({"type":"function","function":{"name":"f"}}])"),
       "tools", "twice"},
      {kChat, chat(R"("tool_choice":"required")"), "tool_choice", "only allowed together with 'tools'"},
      {kChat, chat(R"("tool_choice":"auto")"), "tool_choice", "only allowed together with 'tools'"},
      {kChat, chat(R"("tool_choice":"sometimes","tools":[{"type":"function","function":{"name":"f"}}])"),
       "tool_choice", "'tool_choice' must be"},
      {kChat,
       chat(R"("tool_choice":{"type":"function","function":{"name":"g"}},)"
            R"("tools":[{"type":"function","function":{"name":"f"}}])"),
       "tool_choice", "not in 'tools'"},
      {kChat, chat(R"("functions":[{"name":"f"}])"), "functions", "not supported"},
      {kChat, chat(R"("function_call":{"name":"f"})"), "function_call", "not supported"},
      // structured outputs
      {kChat, chat(R"("response_format":{"type":"xml"})"), "response_format", "'xml' is not supported"},
      {kChat, chat(R"("response_format":{"type":"json_schema","json_schema":{}})"), "response_format",
       "'response_format.json_schema.schema' is required"},
      {kChat, chat(R"("response_format":{"type":"json_schema"})"), "response_format", "'name' and 'schema'"},
      {kChat, chat(R"("response_format":{"type":"json_schema","json_schema":{"name":"a","schema":)"
                   R"({"type":"object","properties":{"a":{"type":"string","format":"email"}}}}})"),
       "response_format", "JSON schema at #/properties/a: the keyword 'format' is not supported"},
      {kChat, chat(R"("response_format":{"type":"json_schema","json_schema":{"name":"a","schema":)"
                   R"({"type":"array","minItems":2,"maxItems":1}}})"),
       "response_format", "minItems is larger than maxItems"},
      {kChat, chat(R"("response_format":"json")"), "response_format", "'response_format' must be an object"},
      {kChat, chat(R"("response_format":{"type":"json_object"},"guided_choice":["a"])"), "guided_choice",
       "only one of"},
      {kChat, chat(R"("response_format":{"type":"json_object"},"ignore_eos":true)"), "ignore_eos",
       "'ignore_eos' together with a structured output"},
      {kChat, chat(R"("response_format":{"type":"json_object"},"min_tokens":3)"), "min_tokens", "structured output"},
      {kComp, comp(R"("guided_choice":[])"), "guided_choice", "a non-empty array of strings"},
      {kComp, comp(R"("guided_choice":["a",""])"), "guided_choice", "empty string"},
      {kComp, comp(R"("guided_json":"{oops")"), "guided_json", "not JSON"},
      {kComp, comp(R"("guided_json":{"type":"string","pattern":"x"})"), "guided_json", "'pattern'"},
      {kComp, comp(R"("guided_regex":"a+")"), "guided_regex", "not supported"},
      {kComp, comp(R"("suffix":"tail")"), "suffix", "'suffix'"},
      {kComp, comp(R"("suffix":3)"), "suffix", "'suffix' must be a string"},
      {kChat, chat(R"("modalities":["text","audio"])"), "modalities", "'audio' is not supported"},
      {kChat, chat(R"("audio":{"voice":"alloy"})"), "audio", "not supported"},
      {kChat, chat(R"("user":5)"), "user", "'user' must be a string"},
      // kv_policy
      {kComp, comp(R"("kv_policy":"lazy")"), "kv_policy", "'kv_policy' must be an object"},
      {kComp, comp(R"("kv_policy":{"budget":5})"), "kv_policy", "name"},
      {kChat, chat(R"("kv_policy":{"name":"lazy","budget":[1]})"), "kv_policy", "'kv_policy.budget' must be a number"},
      {kChat, chat(R"("kv_policy":{"name":"lazy","budget":"many"})"), "kv_policy", "budget"},
  };
  for (const Rejection& c : cases) {
    SCOPED_TRACE(c.body);
    const ApiError e = rejection(c.endpoint, c.body, limits);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_EQ(e.param, c.param);
    EXPECT_NE(std::string(e.what()).find(c.message_part), std::string::npos) << "message: " << e.what();
  }
}

TEST(OpenAiRequest, MalformedJsonNamesThePosition) {
  const ApiError e = rejection(kComp, "{\"model\": \"m\",\n \"prompt\": oops}");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "");
  EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("column"), std::string::npos) << e.what();
}

TEST(OpenAiRequest, InvalidUtf8IsA400ThatSaysSo) {
  const std::string bodies[] = {
      "{\"model\":\"m\",\"prompt\":\"ab\xFF\"}",          // a byte that is never UTF-8
      "{\"model\":\"m\",\"prompt\":\"\xC3\"}",            // a truncated sequence
      "{\"model\":\"m\xED\xA0\x80\",\"prompt\":\"a\"}",   // an encoded surrogate
      "{\"model\":\"m\",\"prompt\":\"a\",\"stop\":[\"\xC0\xAF\"]}",  // an overlong form
  };
  for (const std::string& body : bodies) {
    for (const Endpoint endpoint : {kComp, kChat}) {
      const ApiError e = rejection(endpoint, body);
      EXPECT_EQ(e.status, 400);
      EXPECT_NE(std::string(e.what()).find("UTF-8"), std::string::npos) << e.what();
    }
  }
  const ApiError chat_error =
      rejection(kChat, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xF8\"}]}");
  EXPECT_NE(std::string(chat_error.what()).find("UTF-8"), std::string::npos);
  // An escaped lone surrogate cannot become UTF-8 either.
  const ApiError surrogate = rejection(kComp, R"({"model":"m","prompt":"\ud800"})");
  EXPECT_EQ(surrogate.status, 400);
  EXPECT_NE(std::string(surrogate.what()).find("surrogate"), std::string::npos) << surrogate.what();
}

TEST(OpenAiRequest, KvPolicyBuildsThroughTheCatalog) {
  const GenerationRequest full = parse(kChat, chat(R"("kv_policy":{"name":"full"})"));
  ASSERT_TRUE(full.kv_policy.has_value());
  EXPECT_EQ(full.kv_policy->name, "full");
  const GenerationRequest lazy = parse(kComp, comp(R"("kv_policy":{"name":"lazy","budget":128,"window":32})"));
  ASSERT_TRUE(lazy.kv_policy.has_value());
  EXPECT_EQ(lazy.kv_policy->budget(), 128);

  // An unknown name: the message lists the valid policies.
  const ApiError unknown = rejection(kComp, comp(R"("kv_policy":{"name":"magic"})"));
  EXPECT_EQ(unknown.param, "kv_policy");
  for (const PolicyInfo& info : policy_catalog()) {
    EXPECT_NE(std::string(unknown.what()).find(info.name), std::string::npos) << unknown.what();
  }
  // A value out of range names the parameter.
  const ApiError bad = rejection(kComp, comp(R"("kv_policy":{"name":"lazy","budget":-3})"));
  EXPECT_EQ(bad.param, "kv_policy");
  EXPECT_NE(std::string(bad.what()).find("budget"), std::string::npos) << bad.what();
  // An unknown parameter of a known policy.
  const ApiError param = rejection(kComp, comp(R"("kv_policy":{"name":"lazy","bogus":1})"));
  EXPECT_EQ(param.param, "kv_policy");
  EXPECT_NE(std::string(param.what()).find("bogus"), std::string::npos) << param.what();
}

TEST(OpenAiRequest, DeepNestingIsRefusedWhileParsingWhereverItSits) {
  const int depth = 150000;
  const std::string deep = std::string(depth, '[') + std::string(depth, ']');
  const std::string deep_objects = [] {
    std::string s;
    for (int i = 0; i < 50000; ++i) s += "{\"a\":";
    s += "1";
    s += std::string(50000, '}');
    return s;
  }();
  // The crash of issue 19: deep nesting in a member that is not the last
  // (a copy made when the object's member vector grew recursed through it).
  const std::vector<std::string> bodies = {
      R"({"prompt":)" + deep + R"(,"model":"m"})",
      R"({"extra":)" + deep + R"(,"model":"m","prompt":"hi"})",
      comp("\"extra\":" + deep),
      R"({"model":"m","prompt":)" + deep + "}",
      chat(R"("kv_policy":{"name":"lazy","budget":)" + deep + "}"),
      comp("\"stop\":" + deep_objects),
      deep,
  };
  for (const std::string& body : bodies) {
    for (const Endpoint endpoint : {kComp, kChat}) {
      const ApiError e = rejection(endpoint, body);
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, "");
      EXPECT_EQ(std::string(e.what()), "The request body nests arrays and objects deeper than 64 levels");
    }
  }
  // 64 levels (the object itself is the first) are accepted.
  const std::string deepest_allowed = std::string(63, '[') + std::string(63, ']');
  EXPECT_EQ(parse(kComp, comp("\"extra\":" + deepest_allowed)).ignored_fields, std::vector<std::string>{"extra"});
  EXPECT_EQ(rejection(kComp, comp("\"extra\":[" + deepest_allowed + "]")).status, 400);
  // Unbalanced: a parse error, not a crash.
  EXPECT_EQ(rejection(kComp, std::string(depth, '[')).status, 400);

  // Huge numbers.
  EXPECT_EQ(rejection(kComp, comp(R"("max_tokens":99999999999999999999999)")).param, "max_tokens");
  EXPECT_EQ(rejection(kComp, comp(R"("n":-99999999999999999999999)")).param, "n");
  EXPECT_EQ(rejection(kComp, comp(R"("temperature":1e308)")).param, "temperature");
  EXPECT_EQ(rejection(kComp, comp(R"("temperature":1e999)")).status, 400);
  EXPECT_EQ(rejection(kComp, R"({"model":"m","prompt":[18446744073709551615]})").param, "prompt");
  EXPECT_EQ(rejection(kChat, chat(R"("kv_policy":{"name":"lazy","budget":1e300})")).param, "kv_policy");
  // A huge prompt of token ids is fine.
  std::string ids = "[0";
  for (int i = 1; i < 100000; ++i) {
    ids += ',';
    ids += std::to_string(i);
  }
  ids += "]";
  EXPECT_EQ(parse(kComp, R"({"model":"m","prompt":)" + ids + "}").prompts[0].tokens.size(), 100000u);
}

TEST(OpenAiRequest, ErrorMessagesAreValidUtf8AndShort) {
  // A long role is quoted but cut short in the message.
  const std::string role(10000, 'r');
  const ApiError e = rejection(kChat, R"({"model":"m","messages":[{"role":")" + role + R"(","content":"a"}]})");
  EXPECT_LT(std::string(e.what()).size(), 400u);
  // A cut inside a multi-byte character is repaired, never left broken.
  std::string snow;
  for (int i = 0; i < 30; ++i) snow += "\xE2\x98\x83";  // U+2603, 3 bytes
  const ApiError s = rejection(kChat, R"({"model":"m","messages":[{"role":")" + snow + R"(","content":"a"}]})");
  const std::string message = s.what();
  EXPECT_NE(message.find("\xE2\x98\x83"), std::string::npos);
  EXPECT_TRUE(utf8::is_valid(message)) << message;
}

}  // namespace
}  // namespace lazykv::api
