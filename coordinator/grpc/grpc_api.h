// The public gRPC API of the coordinator (common/proto/lazykv/v1/lazykv.proto):
// Generate, streamed token by token, and ListModels, with the semantics of the
// OpenAI-compatible HTTP service: the request is validated by the same parser
// (so the same rules and messages), tokenized by the same PromptEncoder and
// queued on the same Scheduler. A client that cancels, or whose stream breaks,
// cancels its sequences. GrpcServer runs it (synchronous API, one thread per
// call) together with gRPC's standard health service (grpc.health.v1).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "common/metrics/registry.h"
#include "common/rpc/grpc_server.h"
#include "coordinator/scheduler/sequence_queue.h"
#include "coordinator/server/service_config.h"
#include "coordinator/server/prompt_encoder.h"
#include "lazykv/v1/lazykv.grpc.pb.h"

namespace lazykv {

class GrpcApi final : public lazykv::v1::Lazykv::Service {
 public:
  GrpcApi(const Tokenizer& tokenizer, SequenceQueue& scheduler, metrics::Registry& metrics, ServiceConfig config);

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* response) override;

  // Generate calls being answered now.
  int in_flight() const { return in_flight_.load(); }

  // What the GrpcServer running this API must install: the accounting of
  // every call in the metrics (call_accounting.h), also of calls that end
  // before a method runs.
  GrpcServer::Interceptors interceptors();

  // The health service names this service by its full proto name.
  static constexpr const char* kServiceName = "lazykv.v1.Lazykv";

 private:
  // Non-OK with UNAUTHENTICATED when API keys are on and the call has no valid
  // "authorization: Bearer <key>" metadata.
  // On success *key (when given) is the caller's key ("" with keys off).
  grpc::Status authenticate(const grpc::ServerContext& context, std::string* key = nullptr) const;

  const Tokenizer& tokenizer_;
  PromptEncoder prompts_;
  std::shared_ptr<grammar::ConstraintCache> constraints_;
  SequenceQueue& scheduler_;
  metrics::Registry& metrics_;
  ServiceConfig config_;
  std::atomic<int> in_flight_{0};
};

}  // namespace lazykv
