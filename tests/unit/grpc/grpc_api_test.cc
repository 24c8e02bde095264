// The gRPC API over a real server on 127.0.0.1, the real scheduler and the
// in-process worker on a tiny random model, called through generated stubs.
#include "coordinator/grpc/grpc_api.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "common/error.h"
#include "common/metrics/metric_names.h"
#include "coordinator/scheduler/scheduler.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/unit/tiny_model_fixture.h"
#include "worker/local_worker.h"

namespace lazykv {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// The worker, with a gate: once `open_steps` steps have run, the next one
// waits until release(), so a test can act while a sequence is mid-way.
class GatedWorker final : public StepExecutor {
 public:
  explicit GatedWorker(StepExecutor& inner) : inner_(inner) {}
  WorkerInfo info() const override { return inner_.info(); }
  StepResult step(const StepPlan& plan) override {
    {
      std::unique_lock lock(mutex_);
      open_.wait(lock, [&] { return steps_ < open_steps_; });
      ++steps_;
    }
    return inner_.step(plan);
  }
  void close_after(int64_t steps) {
    std::lock_guard lock(mutex_);
    open_steps_ = steps;
  }
  void release() {
    {
      std::lock_guard lock(mutex_);
      open_steps_ = std::numeric_limits<int64_t>::max();
    }
    open_.notify_all();
  }

 private:
  StepExecutor& inner_;
  std::mutex mutex_;
  std::condition_variable open_;
  int64_t steps_ = 0;
  int64_t open_steps_ = std::numeric_limits<int64_t>::max();
};

// What one Generate call returned.
struct Generated {
  grpc::Status status;
  std::vector<v1::GenerateResponse> messages;
  std::map<uint32_t, std::string> text;            // per choice: token texts plus the finish text
  std::map<uint32_t, std::string> finish_reason;   // per choice
  std::map<uint32_t, int64_t> tokens;              // per choice: Token messages
  std::optional<v1::GenerateResponse::Usage> usage;
};

class GrpcApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    TinyModelSpec spec;
    spec.n_ctx = 256;
    TinyModel tiny = load_tiny_model("grpc_test", spec);
    model_ = tiny.model.release();
    tokenizer_ = tiny.tokenizer.release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete model_;
  }

  void SetUp() override { start({}); }
  void TearDown() override {
    if (gate_) gate_->release();
    if (server_) server_->shutdown(std::chrono::steady_clock::now());
    server_.reset();
    if (scheduler_) scheduler_->stop("test over");
  }

  void start(const std::vector<std::string>& keys) {
    server_.reset();
    api_.reset();
    scheduler_.reset();
    gate_.reset();
    worker_.reset();
    LocalWorkerOptions o;
    o.threads = 2;
    o.n_vocab = tokenizer_->n_vocab();
    worker_ = std::make_unique<LocalWorker>(*model_, o);
    gate_ = std::make_unique<GatedWorker>(*worker_);
    scheduler_ = std::make_unique<Scheduler>(*gate_, *tokenizer_, registry_, SchedulerOptions{});
    ServiceConfig config;
    config.model_id = "tiny";
    config.api_keys = keys;
    config.version = "test";
    api_ = std::make_unique<GrpcApi>(*tokenizer_, *scheduler_, registry_, config);
    server_ = std::make_unique<GrpcServer>("127.0.0.1", 0, *api_, GrpcApi::kServiceName, 0, api_->interceptors());
    ASSERT_GT(server_->port(), 0);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials());
    stub_ = v1::Lazykv::NewStub(channel_);
  }

  static v1::GenerateRequest prompt_request(const std::string& prompt, int max_tokens) {
    v1::GenerateRequest r;
    r.set_model("tiny");
    r.set_prompt(prompt);
    r.set_max_tokens(max_tokens);
    r.set_temperature(0);
    return r;
  }

  Generated generate(const v1::GenerateRequest& request, const std::string& key = "") {
    grpc::ClientContext context;
    if (!key.empty()) context.AddMetadata("authorization", "Bearer " + key);
    Generated out;
    auto reader = stub_->Generate(&context, request);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
      out.messages.push_back(m);
      if (m.has_token()) {
        out.text[m.token().index()] += m.token().text();
        ++out.tokens[m.token().index()];
      } else if (m.has_finish()) {
        out.text[m.finish().index()] += m.finish().text();
        EXPECT_EQ(out.finish_reason.count(m.finish().index()), 0u) << "two finishes of one choice";
        out.finish_reason[m.finish().index()] = m.finish().finish_reason();
        EXPECT_EQ(m.finish().completion_tokens(), out.tokens[m.finish().index()]);
      } else {
        EXPECT_TRUE(m.has_usage());
        EXPECT_FALSE(out.usage) << "two usage messages";
        out.usage = m.usage();
      }
    }
    out.status = reader->Finish();
    return out;
  }

  double requests(const std::string& endpoint, const std::string& code) {
    return registry_.counter(metrics::kRequests, {endpoint, code}).value();
  }

  static Model* model_;
  static Tokenizer* tokenizer_;
  metrics::Registry registry_;
  std::unique_ptr<LocalWorker> worker_;
  std::unique_ptr<GatedWorker> gate_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<GrpcApi> api_;
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Lazykv::Stub> stub_;
};

Model* GrpcApiTest::model_ = nullptr;
Tokenizer* GrpcApiTest::tokenizer_ = nullptr;

TEST_F(GrpcApiTest, GreedyGenerationIsStreamedAndRepeatable) {
  const v1::GenerateRequest request = prompt_request("hello world", 12);
  const Generated a = generate(request);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_EQ(a.finish_reason.size(), 1u);
  EXPECT_TRUE(a.finish_reason.at(0) == "stop" || a.finish_reason.at(0) == "length");
  EXPECT_GE(a.tokens.at(0), 1);
  EXPECT_LE(a.tokens.at(0), 12);
  // Token messages first, then the finish, then usage, last.
  ASSERT_GE(a.messages.size(), 3u);
  EXPECT_TRUE(a.messages.front().has_token());
  EXPECT_TRUE(a.messages[a.messages.size() - 2].has_finish());
  EXPECT_TRUE(a.messages.back().has_usage());
  ASSERT_TRUE(a.usage);
  EXPECT_EQ(a.usage->prompt_tokens(), int64_t(tokenizer_->encode("hello world", false).size()));
  EXPECT_EQ(a.usage->completion_tokens(), a.tokens.at(0));
  EXPECT_EQ(a.usage->total_tokens(), a.usage->prompt_tokens() + a.usage->completion_tokens());
  for (const v1::GenerateResponse& m : a.messages) {
    if (m.has_token()) {
      EXPECT_GE(m.token().token_id(), 0);
      EXPECT_FALSE(m.token().has_logprob()) << "log-probabilities were not asked for";
    }
  }

  const Generated b = generate(request);
  ASSERT_TRUE(b.status.ok());
  EXPECT_EQ(b.text, a.text);
  EXPECT_EQ(b.finish_reason, a.finish_reason);
  EXPECT_EQ(requests("grpc_generate", "OK"), 2);
}

TEST_F(GrpcApiTest, LengthFinishesWithIgnoreEos) {
  v1::GenerateRequest request = prompt_request("abc", 7);
  request.set_ignore_eos(true);
  const Generated g = generate(request);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.finish_reason.at(0), "length");
  EXPECT_EQ(g.tokens.at(0), 7);
  EXPECT_EQ(g.usage->completion_tokens(), 7);
}

TEST_F(GrpcApiTest, DefaultMaxTokensIsSixteenForPrompts) {
  v1::GenerateRequest request = prompt_request("abc", 1);
  request.clear_max_tokens();
  request.set_ignore_eos(true);
  const Generated g = generate(request);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.usage->completion_tokens(), 16);
}

TEST_F(GrpcApiTest, SeveralChoicesEachFinish) {
  v1::GenerateRequest request = prompt_request("abc", 6);
  request.set_n(2);
  request.set_temperature(1);
  request.set_seed(7);
  const Generated g = generate(request);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  ASSERT_EQ(g.finish_reason.size(), 2u);
  EXPECT_EQ(g.finish_reason.count(0), 1u);
  EXPECT_EQ(g.finish_reason.count(1), 1u);
  EXPECT_EQ(g.usage->completion_tokens(), g.tokens.at(0) + g.tokens.at(1));
  // The prompt is counted once.
  EXPECT_EQ(g.usage->prompt_tokens(), int64_t(tokenizer_->encode("abc", false).size()));
  // Same seed, same choices.
  const Generated again = generate(request);
  EXPECT_EQ(again.text, g.text);
}

TEST_F(GrpcApiTest, TopLogprobs) {
  v1::GenerateRequest request = prompt_request("abc", 4);
  request.set_top_logprobs(3);
  const Generated g = generate(request);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  int tokens = 0;
  for (const v1::GenerateResponse& m : g.messages) {
    if (!m.has_token()) continue;
    ++tokens;
    ASSERT_TRUE(m.token().has_logprob());
    EXPECT_LE(m.token().logprob(), 0.0f);
    ASSERT_EQ(m.token().top_logprobs_size(), 3);
    // Greedy: the sampled token is the most likely one.
    EXPECT_NEAR(m.token().top_logprobs(0).logprob(), m.token().logprob(), 1e-4);
    EXPECT_GE(m.token().top_logprobs(0).logprob(), m.token().top_logprobs(1).logprob());
    EXPECT_GE(m.token().top_logprobs(1).logprob(), m.token().top_logprobs(2).logprob());
  }
  EXPECT_GE(tokens, 1);

  request.set_top_logprobs(0);
  const Generated only = generate(request);
  for (const v1::GenerateResponse& m : only.messages) {
    if (!m.has_token()) continue;
    EXPECT_TRUE(m.token().has_logprob());
    EXPECT_EQ(m.token().top_logprobs_size(), 0);
  }
}

TEST_F(GrpcApiTest, PromptTokensMatchTheTextPrompt) {
  const Generated text = generate(prompt_request("hello", 8));
  v1::GenerateRequest request = prompt_request("", 8);
  for (int32_t id : tokenizer_->encode("hello", false)) request.mutable_prompt_tokens()->add_ids(id);
  ASSERT_EQ(request.input_case(), v1::GenerateRequest::kPromptTokens);
  const Generated tokens = generate(request);
  ASSERT_TRUE(tokens.status.ok()) << tokens.status.error_message();
  EXPECT_EQ(tokens.text, text.text);
  EXPECT_EQ(tokens.usage->prompt_tokens(), text.usage->prompt_tokens());
}

TEST_F(GrpcApiTest, ChatUsesTheTemplate) {
  v1::GenerateRequest request;
  request.set_model("tiny");
  request.set_temperature(0);
  request.set_max_tokens(5);
  v1::ChatMessage* m = request.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("hi");
  const Generated g = generate(request);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  // The ChatML rendering is longer than the message itself.
  EXPECT_GT(g.usage->prompt_tokens(), int64_t(tokenizer_->encode("hi", false).size()) + 4);
  EXPECT_EQ(g.finish_reason.size(), 1u);

  // Without max_tokens, chat may use the rest of the context.
  request.clear_max_tokens();
  request.set_ignore_eos(true);
  const Generated rest = generate(request);
  ASSERT_TRUE(rest.status.ok()) << rest.status.error_message();
  EXPECT_EQ(rest.usage->prompt_tokens() + rest.usage->completion_tokens(), 256);
  EXPECT_EQ(rest.finish_reason.at(0), "length");
}

TEST_F(GrpcApiTest, KvPolicyIsApplied) {
  v1::GenerateRequest request = prompt_request("abc", 4);
  request.mutable_kv_policy()->set_name("streaming");
  const Generated g = generate(request);
  EXPECT_TRUE(g.status.ok()) << g.status.error_message();
}

TEST_F(GrpcApiTest, InvalidRequestsAreRejected) {
  struct Case {
    std::string what;
    v1::GenerateRequest request;
    grpc::StatusCode code;
    std::string in_message;  // a part of the expected message
  };
  std::vector<Case> cases;
  {
    v1::GenerateRequest r = prompt_request("abc", 4);
    r.mutable_kv_policy()->set_name("nonsense");
    cases.push_back({"unknown policy", r, grpc::INVALID_ARGUMENT, "lazy"});
  }
  {
    v1::GenerateRequest r = prompt_request("abc", 4);  // the tiny model has no query statistics
    r.mutable_kv_policy()->set_name("triattention");
    cases.push_back({"policy the model cannot run", r, grpc::INVALID_ARGUMENT, "lazykv calibrate"});
  }
  {
    v1::GenerateRequest r = prompt_request("abc", 4);
    r.set_model("other");
    cases.push_back({"unknown model", r, grpc::NOT_FOUND, "'other' does not exist"});
  }
  cases.push_back({"empty prompt", prompt_request("", 4), grpc::INVALID_ARGUMENT, "'prompt' must not be empty"});
  {
    v1::GenerateRequest r = prompt_request("abc", 4);
    r.clear_prompt();
    cases.push_back({"no input", r, grpc::INVALID_ARGUMENT, "is required"});
  }
  cases.push_back({"context overflow", prompt_request("abc", 300), grpc::INVALID_ARGUMENT, "maximum context length"});
  {
    v1::GenerateRequest r = prompt_request("abc", 4);
    r.set_temperature(3);
    cases.push_back({"temperature", r, grpc::INVALID_ARGUMENT, "'temperature' must be between 0 and 2"});
  }
  {
    v1::GenerateRequest r = prompt_request("abc", 4);
    r.set_top_logprobs(21);
    cases.push_back({"top_logprobs", r, grpc::INVALID_ARGUMENT, "top_logprobs"});
  }
  {
    v1::GenerateRequest r = prompt_request("abc", 4);
    r.mutable_prompt_tokens()->add_ids(1 << 30);
    cases.push_back({"token id", r, grpc::INVALID_ARGUMENT, "outside the vocabulary"});
  }
  {
    v1::GenerateRequest r = prompt_request("abc", 4);
    r.mutable_chat();
    cases.push_back({"no messages", r, grpc::INVALID_ARGUMENT, "'messages' must not be empty"});
  }
  for (const Case& c : cases) {
    const Generated g = generate(c.request);
    EXPECT_EQ(g.status.error_code(), c.code) << c.what << ": " << g.status.error_message();
    EXPECT_NE(g.status.error_message().find(c.in_message), std::string::npos)
        << c.what << ": " << g.status.error_message();
    EXPECT_TRUE(g.messages.empty()) << c.what;
  }
  // The policy error lists the valid policies.
  v1::GenerateRequest r = prompt_request("abc", 4);
  r.mutable_kv_policy()->set_name("nonsense");
  const std::string message = generate(r).status.error_message();
  for (const PolicyInfo& p : policy_catalog()) EXPECT_NE(message.find(p.name), std::string::npos) << message;
  // A bad parameter names the parameter.
  r.mutable_kv_policy()->set_name("lazy");
  (*r.mutable_kv_policy()->mutable_params())["budget"] = -5;
  const Generated bad_param = generate(r);
  EXPECT_EQ(bad_param.status.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_NE(bad_param.status.error_message().find("budget"), std::string::npos) << bad_param.status.error_message();

  EXPECT_EQ(requests("grpc_generate", "NOT_FOUND"), 1);
  EXPECT_GE(requests("grpc_generate", "INVALID_ARGUMENT"), 8);
  EXPECT_GE(registry_.counter(metrics::kErrors, {"invalid_request"}).value(), 9);
  // Still serving.
  EXPECT_TRUE(generate(prompt_request("x", 2)).status.ok());
}

TEST_F(GrpcApiTest, NonFiniteNumbersAreRefusedAsTheHttpApiRefusesThem) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::function<void(v1::GenerateRequest&)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[&](v1::GenerateRequest& r) { r.set_temperature(inf); }, "'temperature' must be between 0 and 2, got inf"},
      {[&](v1::GenerateRequest& r) { r.set_temperature(nan); }, "'temperature' must be between 0 and 2, got nan"},
      {[&](v1::GenerateRequest& r) { r.set_top_p(nan); }, "'top_p' must be greater than 0 and at most 1, got nan"},
      {[&](v1::GenerateRequest& r) { r.set_min_p(-inf); }, "'min_p' must be between 0 and 1, got -inf"},
      {[&](v1::GenerateRequest& r) { r.set_presence_penalty(nan); },
       "'presence_penalty' must be between -2 and 2, got nan"},
      {[&](v1::GenerateRequest& r) { r.set_repetition_penalty(inf); },
       "'repetition_penalty' must be between 0.01 and 100, got inf"},
      {[&](v1::GenerateRequest& r) { (*r.mutable_logit_bias())[3] = nan; },
       "'logit_bias' must be between -100 and 100, got nan"},
      {[&](v1::GenerateRequest& r) { (*r.mutable_kv_policy()->mutable_params())["budget"] = inf; },
       "'kv_policy.budget' must be a finite number, got inf"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest request = prompt_request("abc", 4);
    c.set(request);
    const Generated g = generate(request);
    EXPECT_EQ(g.status.error_code(), grpc::INVALID_ARGUMENT) << c.message;
    EXPECT_EQ(g.status.error_message(), c.message);
  }
  EXPECT_EQ(requests("grpc_generate", "INVALID_ARGUMENT"), double(cases.size()));
}

TEST_F(GrpcApiTest, PenaltiesLogitBiasAndMinTokensReachTheSampler) {
  v1::GenerateRequest forced = prompt_request("abc", 5);
  forced.set_temperature(0);
  (*forced.mutable_logit_bias())[9] = 100;
  forced.set_presence_penalty(2);  // cannot outweigh a bias of 100
  forced.set_repetition_penalty(1.3f);
  const Generated g = generate(forced);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  int tokens = 0;
  for (const v1::GenerateResponse& m : g.messages) {
    if (!m.has_token()) continue;
    EXPECT_EQ(m.token().token_id(), 9);
    ++tokens;
  }
  EXPECT_EQ(tokens, 5);
  // min_tokens reaches the sampler: the end token, forced, waits for it.
  v1::GenerateRequest held = prompt_request("abc", 8);
  held.set_temperature(0);
  (*held.mutable_logit_bias())[tokenizer_->spec().eog_ids.at(0)] = 100;
  ASSERT_TRUE(generate(held).status.ok());
  ASSERT_TRUE(generate(held).usage.has_value());
  EXPECT_EQ(generate(held).usage->completion_tokens(), 1);
  held.set_min_tokens(3);
  EXPECT_EQ(generate(held).usage->completion_tokens(), 4);
  struct Case {
    std::function<void(v1::GenerateRequest&)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](v1::GenerateRequest& r) { (*r.mutable_logit_bias())[-4] = 1; }, "'logit_bias' keys must be token ids"},
      {[](v1::GenerateRequest& r) { (*r.mutable_logit_bias())[1 << 30] = 1; }, "outside the vocabulary"},
      {[](v1::GenerateRequest& r) { r.set_min_tokens(5); }, "'min_tokens' (5) must not exceed 'max_tokens' (4)"},
      {[](v1::GenerateRequest& r) { r.set_frequency_penalty(-3); }, "'frequency_penalty' must be between -2 and 2"},
      {[](v1::GenerateRequest& r) { r.set_presence_penalty(3); }, "'presence_penalty' must be between -2 and 2"},
      {[](v1::GenerateRequest& r) { r.set_repetition_penalty(200); }, "'repetition_penalty' must be between 0.01"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest request = prompt_request("abc", 4);
    c.set(request);
    const Generated bad = generate(request);
    EXPECT_EQ(bad.status.error_code(), grpc::INVALID_ARGUMENT) << c.message;
    EXPECT_NE(bad.status.error_message().find(c.message), std::string::npos) << bad.status.error_message();
  }
}

TEST_F(GrpcApiTest, AMessageThatDoesNotParseIsInvalidArgumentCountedAndLoggedSparingly) {
  // A string field with invalid UTF-8: protobuf refuses the message before
  // any method runs (and logs a line each time, on both sides here).
  v1::GenerateRequest request = prompt_request("abc", 4);
  request.set_prompt("bad \xff bytes");
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 30; ++i) {
    const Generated g = generate(request);
    EXPECT_EQ(g.status.error_code(), grpc::INVALID_ARGUMENT) << g.status.error_message();
    EXPECT_NE(g.status.error_message().find("not valid UTF-8"), std::string::npos) << g.status.error_message();
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  size_t lines = 0;
  for (size_t at = log.find("invalid UTF-8"); at != std::string::npos; at = log.find("invalid UTF-8", at + 1)) ++lines;
  EXPECT_LE(lines, 10u) << log;
  EXPECT_EQ(requests("grpc_generate", "INVALID_ARGUMENT"), 30);
  EXPECT_EQ(registry_.counter(metrics::kErrors, {"invalid_request"}).value(), 30);
  EXPECT_TRUE(generate(prompt_request("x", 2)).status.ok());  // still serving
}

TEST_F(GrpcApiTest, ACancelledCallFreesItsSequences) {
  gate_->close_after(3);  // the sequence stalls after 3 tokens, far from its 200
  v1::GenerateRequest request = prompt_request("abc", 200);
  request.set_ignore_eos(true);
  grpc::ClientContext context;
  auto reader = stub_->Generate(&context, request);
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  EXPECT_TRUE(m.has_token());
  context.TryCancel();
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::CANCELLED);
  // The server's handler notices, cancels the sequence and returns.
  for (int i = 0; i < 1000 && api_->in_flight() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(api_->in_flight(), 0);
  gate_->release();
  EXPECT_TRUE(scheduler_->wait_idle(std::chrono::steady_clock::now() + std::chrono::seconds(20)));
  // At most the stalled step's token came after the cancel.
  EXPECT_LE(registry_.counter(metrics::kGenerationTokens).value(), 4);
  scheduler_->stop("test over");
  EXPECT_EQ(worker_->n_sequences(), 0u);
  server_->shutdown(std::chrono::steady_clock::now() + std::chrono::seconds(5));
  EXPECT_EQ(api_->in_flight(), 0);
  EXPECT_EQ(requests("grpc_generate", "CANCELLED"), 1);
  EXPECT_EQ(registry_.counter(metrics::kErrors, {"cancelled"}).value(), 1);
}

TEST_F(GrpcApiTest, DrainingRejectsNewCalls) {
  scheduler_->drain();
  const Generated g = generate(prompt_request("abc", 4));
  EXPECT_EQ(g.status.error_code(), grpc::UNAVAILABLE) << g.status.error_message();
}

TEST_F(GrpcApiTest, ListModels) {
  grpc::ClientContext context;
  v1::ListModelsResponse response;
  ASSERT_TRUE(stub_->ListModels(&context, {}, &response).ok());
  ASSERT_EQ(response.models_size(), 1);
  EXPECT_EQ(response.models(0).id(), "tiny");
  EXPECT_EQ(response.models(0).context_length(), 256);
  EXPECT_EQ(response.models(0).owned_by(), "lazykv");
  EXPECT_EQ(requests("grpc_list_models", "OK"), 1);
}

TEST_F(GrpcApiTest, HealthFollowsServingStatus) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  const auto check = [&](const std::string& service) {
    grpc::ClientContext context;
    HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    const grpc::Status status = health->Check(&context, request, &response);
    EXPECT_TRUE(status.ok()) << service << ": " << status.error_message();
    return response.status();
  };
  EXPECT_EQ(check(""), HealthCheckResponse::SERVING);
  EXPECT_EQ(check("lazykv.v1.Lazykv"), HealthCheckResponse::SERVING);
  server_->set_serving(false);
  EXPECT_EQ(check(""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(check("lazykv.v1.Lazykv"), HealthCheckResponse::NOT_SERVING);
  server_->set_serving(true);
  EXPECT_EQ(check(""), HealthCheckResponse::SERVING);
  // An unknown service is NOT_FOUND.
  grpc::ClientContext context;
  HealthCheckRequest request;
  request.set_service("no.such.Service");
  HealthCheckResponse response;
  EXPECT_EQ(health->Check(&context, request, &response).error_code(), grpc::NOT_FOUND);
}

TEST_F(GrpcApiTest, ApiKeysAreRequired) {
  start({"secret"});
  const Generated none = generate(prompt_request("abc", 2));
  EXPECT_EQ(none.status.error_code(), grpc::UNAUTHENTICATED);
  EXPECT_NE(none.status.error_message().find("missing API key"), std::string::npos);
  const Generated wrong = generate(prompt_request("abc", 2), "guess");
  EXPECT_EQ(wrong.status.error_code(), grpc::UNAUTHENTICATED);
  EXPECT_TRUE(generate(prompt_request("abc", 2), "secret").status.ok());

  grpc::ClientContext anonymous;
  v1::ListModelsResponse response;
  EXPECT_EQ(stub_->ListModels(&anonymous, {}, &response).error_code(), grpc::UNAUTHENTICATED);
  grpc::ClientContext with_key;
  with_key.AddMetadata("authorization", "Bearer secret");
  EXPECT_TRUE(stub_->ListModels(&with_key, {}, &response).ok());
  EXPECT_EQ(registry_.counter(metrics::kErrors, {"authentication"}).value(), 3);
}

TEST_F(GrpcApiTest, ABusyPortIsAnError) {
  EXPECT_THROW(GrpcServer second("127.0.0.1", server_->port(), *api_, GrpcApi::kServiceName), Error);
}

}  // namespace
}  // namespace lazykv
