// A gRPC client for the end-to-end test of `lazykv serve --grpc-port`:
// skipped unless LAZYKV_GRPC_E2E_ADDRESS (host:port) names a running server;
// LAZYKV_GRPC_E2E_MODEL is the served model name and LAZYKV_GRPC_E2E_KEY an
// API key, when the server wants one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include <grpcpp/grpcpp.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "lazykv/v1/lazykv.grpc.pb.h"

namespace lazykv {
namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

class GrpcE2e : public ::testing::Test {
 protected:
  void SetUp() override {
    address_ = env("LAZYKV_GRPC_E2E_ADDRESS");
    if (address_.empty()) GTEST_SKIP() << "LAZYKV_GRPC_E2E_ADDRESS is not set";
    model_ = env("LAZYKV_GRPC_E2E_MODEL");
    channel_ = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    ASSERT_TRUE(channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)))
        << "no gRPC server at " << address_;
  }
  void authorize(grpc::ClientContext& context) const {
    const std::string key = env("LAZYKV_GRPC_E2E_KEY");
    if (!key.empty()) context.AddMetadata("authorization", "Bearer " + key);
  }
  std::string address_, model_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(GrpcE2e, HealthListModelsAndGenerate) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  for (const char* service : {"", "lazykv.v1.Lazykv"}) {
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    ASSERT_TRUE(health->Check(&context, request, &response).ok()) << service;
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }

  auto stub = v1::Lazykv::NewStub(channel_);
  {
    grpc::ClientContext context;
    authorize(context);
    v1::ListModelsResponse models;
    ASSERT_TRUE(stub->ListModels(&context, {}, &models).ok());
    ASSERT_EQ(models.models_size(), 1);
    if (model_.empty()) {
      model_ = models.models(0).id();
    } else {
      EXPECT_EQ(models.models(0).id(), model_);
    }
    EXPECT_GT(models.models(0).context_length(), 0);
  }

  v1::GenerateRequest request;
  request.set_model(model_);
  request.set_max_tokens(8);
  request.set_temperature(0);
  v1::ChatMessage* message = request.mutable_chat()->add_messages();
  message->set_role("user");
  message->set_content("What is 12*7?");
  const auto run = [&] {
    grpc::ClientContext context;
    authorize(context);
    auto reader = stub->Generate(&context, request);
    v1::GenerateResponse m;
    std::string text, finish;
    int64_t tokens = 0, usage = -1;
    while (reader->Read(&m)) {
      if (m.has_token()) {
        text += m.token().text();
        ++tokens;
      } else if (m.has_finish()) {
        text += m.finish().text();
        finish = m.finish().finish_reason();
      } else {
        usage = m.usage().completion_tokens();
      }
    }
    const grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_TRUE(finish == "stop" || finish == "length") << finish;
    EXPECT_EQ(usage, tokens);
    EXPECT_GE(tokens, 1);
    return text;
  };
  const std::string first = run();
  EXPECT_EQ(run(), first) << "greedy generation is repeatable";
  std::printf("gRPC answer: %s\n", first.c_str());

  request.set_model("no-such-model");
  grpc::ClientContext context;
  authorize(context);
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse m;
  EXPECT_FALSE(reader->Read(&m));
  EXPECT_EQ(reader->Finish().error_code(), grpc::NOT_FOUND);
}

}  // namespace
}  // namespace lazykv
