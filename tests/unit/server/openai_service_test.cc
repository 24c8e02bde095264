// The OpenAI service over the real scheduler and in-process worker on a tiny
// random model, answered into a recording ResponseWriter (the HTTP layer has
// its own tests; the end-to-end test drives both with real clients).
#include "coordinator/server/openai_service.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "coordinator/scheduler/scheduler.h"
#include "coordinator/server/sequence_builder.h"
#include "tests/unit/tiny_model_fixture.h"
#include "worker/local_worker.h"

namespace lazykv {
namespace {

using nlohmann::json;

class RecordingWriter final : public http::ResponseWriter {
 public:
  bool send(int s, std::string_view type, std::string b, const http::Headers& extra) override {
    status = s;
    content_type = type;
    body = std::move(b);
    headers = extra;
    ++responses;
    return true;
  }
  bool start_stream(int s, std::string_view type, const http::Headers& extra) override {
    status = s;
    content_type = type;
    headers = extra;
    streaming = true;
    ++responses;
    return true;
  }
  bool write_chunk(std::string_view data) override {
    if (gone_after >= 0 && int(chunks.size()) >= gone_after) return false;
    chunks.emplace_back(data);
    return true;
  }
  bool end_stream() override {
    ended = true;
    return true;
  }
  bool client_gone() override { return gone_after >= 0 && int(chunks.size()) >= gone_after; }

  // The JSON of every `data:` event except [DONE].
  std::vector<json> events() const {
    std::vector<json> out;
    for (const std::string& c : chunks) {
      EXPECT_EQ(c.rfind("data: ", 0), 0u) << c;
      EXPECT_EQ(c.substr(c.size() - 2), "\n\n");
      const std::string data = c.substr(6, c.size() - 8);
      if (data != "[DONE]") out.push_back(json::parse(data));
    }
    return out;
  }

  int status = 0;
  std::string content_type, body;
  http::Headers headers;
  std::vector<std::string> chunks;
  bool streaming = false, ended = false;
  int responses = 0;
  int gone_after = -1;  // >= 0: the client disappears after this many chunks
};

// A POST to a service of the test's own (the fixture's is `call`).
RecordingWriter post(OpenAiService& service, const std::string& path, const std::string& body) {
  http::Request r;
  r.method = "POST";
  r.path = path;
  r.body = body;
  RecordingWriter w;
  service.handle(r, w);
  return w;
}

class OpenAiServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    TinyModelSpec spec;
    spec.n_ctx = 256;
    TinyModel tiny = load_tiny_model("service_test", spec);
    model_ = tiny.model.release();
    tokenizer_ = tiny.tokenizer.release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete model_;
  }

  void SetUp() override {
    LocalWorkerOptions o;
    o.threads = 2;
    o.n_vocab = tokenizer_->n_vocab();
    worker_ = std::make_unique<LocalWorker>(*model_, o);
    scheduler_ = std::make_unique<Scheduler>(*worker_, *tokenizer_, registry_, scheduler_options_);
    ServiceConfig config;
    config.model_id = "tiny";
    config.api_keys = keys_;
    config.version = "test";
    service_ = std::make_unique<OpenAiService>(*tokenizer_, *scheduler_, registry_, config);
  }

  RecordingWriter call(const std::string& method, const std::string& path, const std::string& body = "",
                       const std::string& key = "") {
    return call_authorized(method, path, body, key.empty() ? "" : "Bearer " + key);
  }
  // With `authorization` as the whole header value ("" for none).
  RecordingWriter call_authorized(const std::string& method, const std::string& path, const std::string& body,
                                  const std::string& authorization) {
    http::Request r;
    r.method = method;
    r.path = path;
    r.body = body;
    if (!authorization.empty()) r.headers.push_back({"authorization", authorization});
    RecordingWriter w;
    service_->handle(r, w);
    EXPECT_EQ(w.responses, 1) << method << " " << path;
    return w;
  }

  static Model* model_;
  static Tokenizer* tokenizer_;
  std::vector<std::string> keys_;
  SchedulerOptions scheduler_options_;
  metrics::Registry registry_;
  std::unique_ptr<LocalWorker> worker_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<OpenAiService> service_;
};

Model* OpenAiServiceTest::model_ = nullptr;
Tokenizer* OpenAiServiceTest::tokenizer_ = nullptr;

TEST_F(OpenAiServiceTest, ChatWholeAndStreamedAgree) {
  const std::string body =
      R"({"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, "temperature": 0})";
  RecordingWriter whole = call("POST", "/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json j = json::parse(whole.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  const int completion = j["usage"]["completion_tokens"];
  EXPECT_GE(completion, 1);
  EXPECT_LE(completion, 12);
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + completion);

  json streamed_body = json::parse(body);
  streamed_body["stream"] = true;
  streamed_body["stream_options"] = {{"include_usage", true}};
  RecordingWriter stream = call("POST", "/v1/chat/completions", streamed_body.dump());
  ASSERT_EQ(stream.status, 200);
  EXPECT_EQ(stream.content_type, "text/event-stream");
  EXPECT_TRUE(stream.ended);
  EXPECT_EQ(stream.chunks.back(), "data: [DONE]\n\n");
  std::string text, finish;
  int roles = 0;
  json usage;
  for (const json& e : stream.events()) {
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    if (!e["usage"].is_null()) usage = e["usage"];
    for (const json& c : e["choices"]) {
      if (c["delta"].contains("role")) ++roles;
      if (c["delta"].contains("content") && c["delta"]["content"].is_string()) text += c["delta"]["content"];
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
  }
  EXPECT_EQ(roles, 1);
  EXPECT_EQ(text, j["choices"][0]["message"]["content"]);
  EXPECT_EQ(finish, j["choices"][0]["finish_reason"]);
  EXPECT_EQ(usage["completion_tokens"], completion);
}

TEST_F(OpenAiServiceTest, CompletionsWithPromptsTimesNAndLogprobs) {
  RecordingWriter w = call("POST", "/v1/completions",
                           R"({"model": "tiny", "prompt": ["ab", "cd"], "n": 2, "max_tokens": 3,
                               "temperature": 0.7, "seed": 3, "logprobs": 2})");
  ASSERT_EQ(w.status, 200) << w.body;
  const json j = json::parse(w.body);
  ASSERT_EQ(j["choices"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const json& c = j["choices"][i];
    EXPECT_EQ(c["index"], i);
    const json& lp = c["logprobs"];
    EXPECT_EQ(lp["tokens"].size(), lp["token_logprobs"].size());
    for (const json& l : lp["token_logprobs"]) EXPECT_LE(l.get<double>(), 0.0);
    for (const json& top : lp["top_logprobs"]) EXPECT_EQ(top.size(), 2u);
    // Offsets count characters: an ASCII token moves the next one by its length.
    const json& offsets = lp["text_offset"];
    ASSERT_EQ(offsets.size(), lp["tokens"].size());
    EXPECT_EQ(offsets[0], 0);
    for (size_t k = 0; k + 1 < offsets.size(); ++k) {
      const std::string token = lp["tokens"][k];
      const bool ascii = std::all_of(token.begin(), token.end(), [](char ch) { return (ch & 0x80) == 0; });
      if (ascii) {
        EXPECT_EQ(offsets[k + 1].get<int>() - offsets[k].get<int>(), int(token.size())) << token;
      }
      EXPECT_GE(offsets[k + 1], offsets[k]);
    }
  }
  // The same seed gives the same choices.
  RecordingWriter again = call("POST", "/v1/completions",
                               R"({"model": "tiny", "prompt": ["ab", "cd"], "n": 2, "max_tokens": 3,
                                   "temperature": 0.7, "seed": 3, "logprobs": 2})");
  const json k = json::parse(again.body);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(k["choices"][i]["text"], j["choices"][i]["text"]);
}

TEST_F(OpenAiServiceTest, ErrorsAreOpenAiJsonWithTheRightStatus) {
  struct Case {
    std::string path, body;
    int status;
    std::string param;
  };
  const std::vector<Case> cases = {
      {"/v1/chat/completions", "{nope", 400, ""},
      {"/v1/chat/completions", R"({"model": "other", "messages": [{"role": "user", "content": "x"}]})", 404, "model"},
      {"/v1/chat/completions", R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1000})",
       400, "messages"},
      {"/v1/completions", R"({"model": "tiny", "prompt": [1, 999999]})", 400, "prompt"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "kv_policy": {"name": "nope"}})", 400, "kv_policy"},
  };
  for (const Case& c : cases) {
    RecordingWriter w = call("POST", c.path, c.body);
    EXPECT_EQ(w.status, c.status) << c.body << " -> " << w.body;
    const json j = json::parse(w.body);
    EXPECT_TRUE(j["error"]["message"].is_string()) << w.body;
    if (!c.param.empty()) {
      EXPECT_EQ(j["error"]["param"], c.param) << w.body;
    }
  }
  EXPECT_EQ(call("GET", "/v1/completions").status, 405);
  EXPECT_EQ(call("GET", "/nothing").status, 404);
  // Still serving.
  EXPECT_EQ(call("POST", "/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 2})").status, 200);
  // A top_p too small for a float keeps the likeliest token (it used to reach the sampler as 0 and fail).
  RecordingWriter tiny_top_p =
      call("POST", "/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 2, "top_p": 1e-46})");
  EXPECT_EQ(tiny_top_p.status, 200) << tiny_top_p.body;
  EXPECT_GE(registry_.counter(metrics::kErrors, {"invalid_request"}).value(), 5);
}

// A policy the model cannot run is the request's error, found before any
// step: a 400 naming kv_policy, streamed or not, and the server goes on.
TEST_F(OpenAiServiceTest, APolicyTheModelCannotRunIsA400) {
  ASSERT_EQ(worker_->info().unavailable_policies.count("triattention"), 1u);  // the tiny model has no query statistics
  for (const char* stream : {"false", "true"}) {
    RecordingWriter w = call("POST", "/v1/completions",
                             std::string(R"({"model": "tiny", "prompt": "x", "max_tokens": 2, "stream": )") + stream +
                                 R"(, "kv_policy": {"name": "triattention"}})");
    EXPECT_EQ(w.status, 400) << w.body;
    EXPECT_FALSE(w.streaming);
    const json j = json::parse(w.body);
    EXPECT_EQ(j["error"]["param"], "kv_policy") << w.body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find("lazykv calibrate"), std::string::npos) << w.body;
  }
  EXPECT_EQ(call("POST", "/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 2})").status, 200);
}

// epicache needs a conversation routed to an episode (lazykv eval
// conversation), which no request carries: a 400 that says so.
TEST_F(OpenAiServiceTest, EpicacheIsA400ThatNamesTheConversationEval) {
  ASSERT_EQ(worker_->info().unavailable_policies.count("epicache"), 1u);
  RecordingWriter w = call("POST", "/v1/completions",
                           R"({"model": "tiny", "prompt": "x", "max_tokens": 2, "kv_policy": {"name": "epicache"}})");
  EXPECT_EQ(w.status, 400) << w.body;
  const json j = json::parse(w.body);
  EXPECT_EQ(j["error"]["param"], "kv_policy") << w.body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find("eval conversation"), std::string::npos) << w.body;
  EXPECT_EQ(call("POST", "/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 2})").status, 200);
}

// A worker whose info does not list what it cannot run (one older than the
// list, or one restarted without the model's query statistics) refuses the
// sequence when it starts: still the request's error, a 400 naming kv_policy,
// and the server goes on.
TEST_F(OpenAiServiceTest, APolicyTheWorkerRefusesAtStartIsA400) {
  struct InfoWithoutTheList final : StepExecutor {
    explicit InfoWithoutTheList(LocalWorker& w) : worker(w) {}
    WorkerInfo info() const override {
      WorkerInfo info = worker.info();
      info.unavailable_policies.clear();
      return info;
    }
    StepResult step(const StepPlan& plan) override { return worker.step(plan); }
    LocalWorker& worker;
  } older(*worker_);
  metrics::Registry registry;
  Scheduler scheduler(older, *tokenizer_, registry, scheduler_options_);
  ServiceConfig config;
  config.model_id = "tiny";
  OpenAiService service(*tokenizer_, scheduler, registry, config);
  const RecordingWriter refused =
      post(service, "/v1/completions",
           R"({"model": "tiny", "prompt": "x", "max_tokens": 2, "kv_policy": {"name": "triattention"}})");
  EXPECT_EQ(refused.status, 400) << refused.body;
  const json j = json::parse(refused.body);
  EXPECT_EQ(j["error"]["type"], "invalid_request_error") << refused.body;
  EXPECT_EQ(j["error"]["param"], "kv_policy") << refused.body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find("triattention"), std::string::npos) << refused.body;
  EXPECT_EQ(registry.counter(metrics::kErrors, {"policy_refused"}).value(), 1);
  EXPECT_EQ(registry.counter(metrics::kErrors, {"worker"}).value(), 0);
  EXPECT_EQ(post(service, "/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 2})").status, 200);
  // The server's own default refused there is the server's error, not the client's.
  config.default_policy = make_policy_config(std::string("triattention"));
  OpenAiService defaulted(*tokenizer_, scheduler, registry, config);
  const RecordingWriter server_side = post(defaulted, "/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 2})");
  EXPECT_EQ(server_side.status, 500) << server_side.body;
}

// A prompt the policy would have to keep whole but cannot fit: the request's
// policy names kv_policy; the server's default names the prompt.
TEST(CheckKvPolicy, APromptThatFillsAKeptBudgetIsA400) {
  const WorkerInfo info;  // the model can run every policy
  ServiceConfig config;
  api::GenerationRequest request;
  request.endpoint = api::Endpoint::kCompletions;
  request.kv_policy = make_policy_config("triattention", {{"budget", "16"}});
  EXPECT_NO_THROW(check_kv_policy(request, 15, info, config));
  const auto param_of_refusal = [&](int32_t prompt_len) {
    try {
      check_kv_policy(request, prompt_len, info, config);
    } catch (const api::ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_NE(std::string(e.what()).find("fills the budget"), std::string::npos) << e.what();
      return e.param;
    }
    return std::string("accepted");
  };
  EXPECT_EQ(param_of_refusal(16), "kv_policy");
  config.default_policy = *request.kv_policy;
  request.kv_policy.reset();
  EXPECT_EQ(param_of_refusal(16), "prompt");
}

// Greedy completions of one prompt; the token ids come back through the
// logprobs' token strings (every token of the tiny vocabulary is distinct).
std::vector<std::string> greedy_tokens(const json& completion) {
  return completion["choices"][0]["logprobs"]["tokens"].get<std::vector<std::string>>();
}

TEST_F(OpenAiServiceTest, LogitBiasAndMinTokensChangeTheOutputAsDefined) {
  const std::string base =
      R"({"model": "tiny", "prompt": [5, 6, 7], "temperature": 0, "logprobs": 0, "max_tokens": 12)";
  RecordingWriter plain = call("POST", "/v1/completions", base + "}");
  ASSERT_EQ(plain.status, 200) << plain.body;
  const std::vector<std::string> first = greedy_tokens(json::parse(plain.body));
  ASSERT_FALSE(first.empty());
  // Ban every token greedy decoding chose: none of them comes back.
  json bans = json::object();
  for (int32_t id = 0; id < tokenizer_->n_vocab(); ++id) {
    if (std::find(first.begin(), first.end(), tokenizer_->token_bytes(id)) != first.end()) bans[std::to_string(id)] = -100;
  }
  RecordingWriter banned = call("POST", "/v1/completions", base + R"(, "logit_bias": )" + bans.dump() + "}");
  ASSERT_EQ(banned.status, 200) << banned.body;
  for (const std::string& t : greedy_tokens(json::parse(banned.body))) {
    EXPECT_EQ(std::find(first.begin(), first.end(), t), first.end()) << "banned token " << t << " was generated";
  }
  // +100 on one token: greedy picks it every time.
  RecordingWriter forced = call("POST", "/v1/completions", base + R"(, "logit_bias": {"9": 100}})");
  ASSERT_EQ(forced.status, 200) << forced.body;
  for (const std::string& t : greedy_tokens(json::parse(forced.body))) EXPECT_EQ(t, tokenizer_->token_bytes(9));

  // The end-of-generation token forced: one token, unless min_tokens holds it back.
  const std::string eos = std::to_string(tokenizer_->spec().eog_ids.at(0));
  RecordingWriter ends = call("POST", "/v1/completions", base + R"(, "logit_bias": {")" + eos + R"(": 100}})");
  ASSERT_EQ(ends.status, 200) << ends.body;
  EXPECT_EQ(json::parse(ends.body)["usage"]["completion_tokens"], 1);
  RecordingWriter held = call("POST", "/v1/completions",
                              base + R"(, "logit_bias": {")" + eos + R"(": 100}, "min_tokens": 5})");
  ASSERT_EQ(held.status, 200) << held.body;
  const json h = json::parse(held.body);
  EXPECT_EQ(h["usage"]["completion_tokens"], 6) << held.body;  // five held back, then the end token
  EXPECT_EQ(h["choices"][0]["finish_reason"], "stop");

  // Stop strings count only from min_tokens on: the first character of the
  // greedy text as a stop ends the reply at once, unless min_tokens holds it.
  const std::string first_text = json::parse(plain.body)["choices"][0]["text"];
  ASSERT_FALSE(first_text.empty());
  const json stop = {{"stop", first_text.substr(0, 1)}};
  const std::string with_stop = base + ", " + stop.dump().substr(1, stop.dump().size() - 2);
  RecordingWriter stopped = call("POST", "/v1/completions", with_stop + "}");
  EXPECT_EQ(json::parse(stopped.body)["choices"][0]["text"], "") << stopped.body;
  RecordingWriter later = call("POST", "/v1/completions", with_stop + R"(, "min_tokens": 4})");
  EXPECT_GE(json::parse(later.body)["usage"]["completion_tokens"], 4) << later.body;
  EXPECT_EQ(json::parse(later.body)["choices"][0]["text"].get<std::string>().substr(0, 1), first_text.substr(0, 1));

  // Ids outside the vocabulary, min_tokens above what the request allows.
  RecordingWriter outside = call("POST", "/v1/completions", base + R"(, "logit_bias": {"999999": 1}})");
  EXPECT_EQ(outside.status, 400);
  EXPECT_EQ(json::parse(outside.body)["error"]["param"], "logit_bias") << outside.body;
  RecordingWriter too_many = call("POST", "/v1/completions", R"({"model": "tiny", "prompt": "x", "min_tokens": 17})");
  EXPECT_EQ(too_many.status, 400);  // completions default to 16 tokens
  EXPECT_EQ(json::parse(too_many.body)["error"]["param"], "min_tokens") << too_many.body;
}

TEST_F(OpenAiServiceTest, AContextOverflowSaysWhatWasAskedAndWhatFits) {
  // n_ctx 256: a prompt of 300 tokens, and 200 tokens with 100 to generate.
  std::string ids = "1";
  for (int i = 1; i < 300; ++i) ids += ",1";
  RecordingWriter whole = call("POST", "/v1/completions", R"({"model": "tiny", "prompt": [)" + ids + "]}");
  EXPECT_EQ(whole.status, 400);
  const std::string m = json::parse(whole.body)["error"]["message"];
  EXPECT_NE(m.find("your prompt resulted in 300 tokens, which leaves no room for a completion"), std::string::npos) << m;
  EXPECT_EQ(m.find('-'), std::string::npos) << m;  // no negative completion
  ids = ids.substr(0, 2 * 200 - 1);
  RecordingWriter both = call("POST", "/v1/completions", R"({"model": "tiny", "prompt": [)" + ids + R"(], "max_tokens": 100})");
  EXPECT_EQ(both.status, 400);
  const std::string n = json::parse(both.body)["error"]["message"];
  EXPECT_NE(n.find("you requested 300 tokens (200 in the prompt, 100 in the completion)"), std::string::npos) << n;
  EXPECT_NE(n.find("at most 56 completion tokens fit"), std::string::npos) << n;
  EXPECT_EQ(json::parse(both.body)["error"]["code"], "context_length_exceeded");
}

TEST_F(OpenAiServiceTest, TokenizeDetokenizeAndTheModelsContext) {
  RecordingWriter t = call("POST", "/tokenize", R"({"model": "tiny", "prompt": "abc", "return_token_strs": true})");
  ASSERT_EQ(t.status, 200) << t.body;
  const json tj = json::parse(t.body);
  const std::vector<int32_t> ids = tj["tokens"];
  EXPECT_EQ(ids, tokenizer_->encode("abc", false));  // the tiny tokenizer adds no BOS
  EXPECT_EQ(tj["count"], ids.size());
  EXPECT_EQ(tj["max_model_len"], 256);
  ASSERT_EQ(tj["token_strs"].size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(tj["token_strs"][i], tokenizer_->token_bytes(ids[i]));

  RecordingWriter d = call("POST", "/detokenize", json{{"tokens", ids}}.dump());
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(json::parse(d.body)["prompt"], "abc");

  // Chat messages tokenize as the generation endpoint encodes them: the
  // same prompt_tokens in usage.
  const std::string messages = R"([{"role": "user", "content": "hello"}])";
  RecordingWriter c = call("POST", "/tokenize", R"({"messages": )" + messages + "}");
  ASSERT_EQ(c.status, 200) << c.body;
  RecordingWriter g = call("POST", "/v1/chat/completions",
                           R"({"model": "tiny", "max_tokens": 1, "messages": )" + messages + "}");
  ASSERT_EQ(g.status, 200) << g.body;
  EXPECT_EQ(json::parse(c.body)["count"], json::parse(g.body)["usage"]["prompt_tokens"]);

  EXPECT_EQ(json::parse(call("GET", "/v1/models").body)["data"][0]["max_model_len"], 256);
  EXPECT_EQ(json::parse(call("GET", "/v1/models/tiny").body)["max_model_len"], 256);

  EXPECT_EQ(call("POST", "/tokenize", R"({"model": "other", "prompt": "a"})").status, 404);
  RecordingWriter outside = call("POST", "/detokenize", R"({"tokens": [999999]})");
  EXPECT_EQ(outside.status, 400);
  EXPECT_EQ(json::parse(outside.body)["error"]["param"], "tokens");
  EXPECT_EQ(call("POST", "/tokenize", "{bad").status, 400);
  EXPECT_EQ(call("GET", "/tokenize").status, 405);
}

// A template that opens the thinking block in the generation prompt, as
// DeepSeek-R1's: the tiny random model never closes it, so its whole reply
// is reasoning_content, token for token what it is as content without the parser.
TEST_F(OpenAiServiceTest, AReplyInsideAThinkingBlockIsReasoningContent) {
  TokenizerSpec spec = tiny_tokenizer_spec({});
  spec.chat_template =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>\\n'}}{% endfor %}{{ '<|im_start|>assistant\\n<think>\\n' }}";
  const Tokenizer thinking(spec);
  LocalWorkerOptions options;
  options.threads = 2;
  options.n_vocab = thinking.n_vocab();
  LocalWorker worker(*model_, options);  // the fixture's scheduler drives worker_
  Scheduler scheduler(worker, thinking, registry_, scheduler_options_);
  const auto serve = [&](std::optional<ReasoningFormat> format, const std::string& body) {
    ServiceConfig config;
    config.model_id = "tiny";
    config.reasoning = format;
    OpenAiService service(thinking, scheduler, registry_, config);
    return post(service, "/v1/chat/completions", body);
  };
  const std::string body =
      R"({"model": "tiny", "max_tokens": 10, "temperature": 0, "messages": [{"role": "user", "content": "2+2?"}])";
  RecordingWriter off = serve(ReasoningFormat::kNone, body + "}");
  ASSERT_EQ(off.status, 200) << off.body;
  const json plain = json::parse(off.body);
  const std::string text = plain["choices"][0]["message"]["content"];
  ASSERT_FALSE(text.empty());
  EXPECT_FALSE(plain["choices"][0]["message"].contains("reasoning_content"));

  const double counted = registry_.counter(metrics::kReasoningTokens).value();
  RecordingWriter on = serve(std::nullopt, body + "}");  // auto: the template mentions <think>
  ASSERT_EQ(on.status, 200) << on.body;
  const json split = json::parse(on.body);
  EXPECT_EQ(split["choices"][0]["message"]["reasoning_content"], text);
  EXPECT_EQ(split["choices"][0]["message"]["content"], "");
  EXPECT_EQ(split["usage"]["completion_tokens_details"]["reasoning_tokens"], split["usage"]["completion_tokens"]);
  EXPECT_EQ(registry_.counter(metrics::kReasoningTokens).value() - counted,
            split["usage"]["completion_tokens"].get<double>());

  RecordingWriter streamed =
      serve(std::nullopt, body + R"(, "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_EQ(streamed.status, 200);
  std::string reasoning, content;
  for (const json& e : streamed.events()) {
    if (e["choices"].empty()) {
      EXPECT_EQ(e["usage"]["completion_tokens_details"]["reasoning_tokens"], e["usage"]["completion_tokens"]);
      continue;
    }
    const json& delta = e["choices"][0]["delta"];
    reasoning += delta.value("reasoning_content", "");
    content += delta.value("content", "");
  }
  EXPECT_EQ(reasoning, text);
  EXPECT_EQ(content, "");

  // Evictions while thinking count as the thinking phase's.
  const double evicted = registry_.counter(metrics::kEvictions).value();
  const double thinking_evicted = registry_.counter(metrics::kEvictionsByPhase, {"thinking"}).value();
  RecordingWriter evicting = serve(std::nullopt, R"({"model": "tiny", "max_tokens": 24, "temperature": 0, )"
                                                 R"("messages": [{"role": "user", "content": "2+2?"}], )"
                                                 R"("kv_policy": {"name": "streaming", "budget": 12, "sinks": 2}})");
  ASSERT_EQ(evicting.status, 200) << evicting.body;
  const double by_phase = registry_.counter(metrics::kEvictionsByPhase, {"thinking"}).value() - thinking_evicted;
  EXPECT_GT(by_phase, 0);
  EXPECT_EQ(by_phase, registry_.counter(metrics::kEvictions).value() - evicted);
}

TEST_F(OpenAiServiceTest, ToolsNeedATemplateThatTeachesACallFormat) {
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f"}}])";
  const std::string messages = R"("messages": [{"role": "user", "content": "hi"}], "max_tokens": 1)";
  // The tiny template has no tool-call format: offering tools is a clear 400 ...
  RecordingWriter offered =
      call("POST", "/v1/chat/completions", R"({"model": "tiny", )" + messages + ", " + tools + "}");
  EXPECT_EQ(offered.status, 400);
  EXPECT_EQ(json::parse(offered.body)["error"]["param"], "tools") << offered.body;
  EXPECT_NE(offered.body.find("tool-call format"), std::string::npos) << offered.body;
  // ... and tool_choice "none" does not offer them: the prompt is the one without tools.
  RecordingWriter none = call("POST", "/v1/chat/completions",
                              R"({"model": "tiny", )" + messages + ", " + tools + R"(, "tool_choice": "none"})");
  ASSERT_EQ(none.status, 200) << none.body;
  RecordingWriter plain = call("POST", "/v1/chat/completions", R"({"model": "tiny", )" + messages + "}");
  EXPECT_EQ(json::parse(none.body)["usage"]["prompt_tokens"], json::parse(plain.body)["usage"]["prompt_tokens"]);
}

TEST_F(OpenAiServiceTest, AClientThatLeavesCancelsItsSequences) {
  RecordingWriter w;
  w.gone_after = 3;
  http::Request r;
  r.method = "POST";
  r.path = "/v1/completions";
  r.body = R"({"model": "tiny", "prompt": "abc", "max_tokens": 200, "stream": true, "temperature": 1, "seed": 1,
               "logprobs": 0})";
  service_->handle(r, w);
  EXPECT_EQ(w.chunks.size(), 3u);
  EXPECT_FALSE(w.ended);
  scheduler_->stop("test over");
  EXPECT_EQ(worker_->n_sequences(), 0u);
  EXPECT_EQ(registry_.counter(metrics::kErrors, {"cancelled"}).value(), 1);
}

TEST_F(OpenAiServiceTest, HealthReadyModelsAndMetrics) {
  EXPECT_EQ(call("GET", "/health").status, 200);
  EXPECT_EQ(call("GET", "/ready").status, 200);
  const json models = json::parse(call("GET", "/v1/models").body);
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(call("GET", "/v1/models/tiny").status, 200);
  EXPECT_EQ(call("GET", "/v1/models/else").status, 404);
  RecordingWriter m = call("GET", "/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("lazykv_build_info{version=\"test\",model=\"tiny\"} 1"), std::string::npos) << m.body;
  scheduler_->drain();
  EXPECT_EQ(call("GET", "/ready").status, 503);
  RecordingWriter refused = call("POST", "/v1/completions", R"({"model": "tiny", "prompt": "x"})");
  EXPECT_EQ(refused.status, 503);
  ASSERT_FALSE(refused.headers.empty());
  EXPECT_EQ(refused.headers[0].first, "Retry-After");
}

class OpenAiServiceSmallQueueTest : public OpenAiServiceTest {
 protected:
  void SetUp() override {
    scheduler_options_.max_waiting = 8;
    OpenAiServiceTest::SetUp();
  }
};

TEST_F(OpenAiServiceSmallQueueTest, PromptsTimesNBeyondTheQueueAreRefusedBeforeBeingBuilt) {
  // 3 prompts times n = 3 can never fit a queue of 8: a 400 naming n (a 503 would invite retries).
  RecordingWriter w = call("POST", "/v1/completions", R"({"model": "tiny", "prompt": ["a", "b", "c"], "n": 3})");
  EXPECT_EQ(w.status, 400) << w.body;
  EXPECT_EQ(json::parse(w.body)["error"]["param"], "n") << w.body;
  EXPECT_EQ(call("POST", "/v1/completions", R"({"model": "tiny", "prompt": ["a", "b"], "n": 4, "max_tokens": 1})").status,
            200);
}

class OpenAiServiceKeysTest : public OpenAiServiceTest {
 protected:
  void SetUp() override {
    keys_ = {"k1"};
    OpenAiServiceTest::SetUp();
  }
};

TEST_F(OpenAiServiceKeysTest, ApiKeysAreRequiredOnV1AndTheTokenizer) {
  EXPECT_EQ(call("GET", "/v1/models").status, 401);
  EXPECT_EQ(call("GET", "/v1/models", "", "wrong").status, 401);
  EXPECT_EQ(call("GET", "/v1/models", "", "k1").status, 200);
  EXPECT_EQ(call("POST", "/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 1})").status, 401);
  EXPECT_EQ(call("POST", "/tokenize", R"({"prompt": "x"})").status, 401);
  EXPECT_EQ(call("POST", "/detokenize", R"({"tokens": [5]})").status, 401);
  EXPECT_EQ(call("POST", "/tokenize", R"({"prompt": "x"})", "k1").status, 200);
  http::Request head;  // the header alone is refused before the body is read
  head.method = "POST";
  head.path = "/tokenize";
  EXPECT_TRUE(service_->check_header(head).has_value());
  EXPECT_EQ(call("GET", "/health").status, 200);
  EXPECT_EQ(call("GET", "/metrics").status, 200);
}

TEST_F(OpenAiServiceKeysTest, TheBearerSchemeIsCaseInsensitiveAndA401SaysWhatItWants) {
  EXPECT_EQ(call_authorized("GET", "/v1/models", "", "bearer k1").status, 200);
  EXPECT_EQ(call_authorized("GET", "/v1/models", "", "BEARER   k1 ").status, 200);
  for (const std::string auth : {"Basic k1", "Bearer", "Bearer k", "Bearer k1x", "Bearerk1"}) {
    RecordingWriter w = call_authorized("GET", "/v1/models", "", auth);
    EXPECT_EQ(w.status, 401) << auth;
    const json error = json::parse(w.body)["error"];
    EXPECT_EQ(error["type"], "invalid_request_error") << auth;  // as OpenAI answers
    EXPECT_EQ(error["code"], "invalid_api_key") << auth;
    const http::Headers expected = {{"WWW-Authenticate", "Bearer"}};
    EXPECT_EQ(w.headers, expected) << auth;
  }
}

TEST_F(OpenAiServiceKeysTest, TheHeaderCheckRefusesAWrongKeyBeforeTheBody) {
  const auto head = [](const std::string& path, const std::string& authorization) {
    http::Request r;
    r.method = "POST";
    r.path = path;
    if (!authorization.empty()) r.headers.push_back({"authorization", authorization});
    return r;
  };
  const std::optional<http::EarlyAnswer> refused = service_->check_header(head("/v1/chat/completions", ""));
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status, 401);
  EXPECT_EQ(json::parse(refused->body)["error"]["code"], "invalid_api_key");
  EXPECT_EQ(refused->headers, (http::Headers{{"WWW-Authenticate", "Bearer"}}));
  EXPECT_TRUE(service_->check_header(head("/v1/models/x", "Bearer wrong")).has_value());
  EXPECT_FALSE(service_->check_header(head("/v1/completions", "Bearer k1")).has_value());
  // No key needed, or a 404 the handler gives.
  EXPECT_FALSE(service_->check_header(head("/health", "")).has_value());
  EXPECT_FALSE(service_->check_header(head("/nothing", "")).has_value());
  EXPECT_EQ(registry_.counter(metrics::kRequests, {"chat_completions", "401"}).value(), 1);
  EXPECT_EQ(registry_.counter(metrics::kRequests, {"models", "401"}).value(), 1);
  EXPECT_EQ(registry_.counter(metrics::kErrors, {"authentication"}).value(), 2);
}

TEST_F(OpenAiServiceTest, TheServersOwnAnswersAreCounted) {
  for (const int status : {400, 408, 408, 413, 431, 503}) service_->count_server_answer(status);
  EXPECT_EQ(registry_.counter(metrics::kRequests, {"http", "408"}).value(), 2);
  EXPECT_EQ(registry_.counter(metrics::kRequests, {"http", "503"}).value(), 1);
  EXPECT_EQ(registry_.counter(metrics::kErrors, {"invalid_request"}).value(), 5);
  EXPECT_EQ(registry_.counter(metrics::kErrors, {"overloaded"}).value(), 1);
}

}  // namespace
}  // namespace lazykv
