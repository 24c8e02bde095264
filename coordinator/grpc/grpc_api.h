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
#include "coordinator/scheduler/scheduler.h"
#include "coordinator/server/service_config.h"
#include "coordinator/server/prompt_encoder.h"
#include "lazykv/v1/lazykv.grpc.pb.h"

namespace lazykv {

class GrpcApi final : public lazykv::v1::Lazykv::Service {
 public:
  GrpcApi(const Tokenizer& tokenizer, Scheduler& scheduler, metrics::Registry& metrics, ServiceConfig config);

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* response) override;

  // Generate calls being answered now.
  int in_flight() const { return in_flight_.load(); }

  // The health service names this service by its full proto name.
  static constexpr const char* kServiceName = "lazykv.v1.Lazykv";

 private:
  // Non-OK with UNAUTHENTICATED when API keys are on and the call has no valid
  // "authorization: Bearer <key>" metadata.
  // On success *key (when given) is the caller's key ("" with keys off).
  grpc::Status authenticate(const grpc::ServerContext& context, std::string* key = nullptr) const;
  // Counts the call's status in kRequests (and kErrors when it failed).
  grpc::Status finish(const std::string& endpoint, grpc::Status status);

  const Tokenizer& tokenizer_;
  PromptEncoder prompts_;
  Scheduler& scheduler_;
  metrics::Registry& metrics_;
  ServiceConfig config_;
  std::atomic<int> in_flight_{0};
};

// A started gRPC server offering one service plus grpc.health.v1. Stopped
// (at once) when destroyed, unless shutdown() was called before.
class GrpcServer {
 public:
  // Listens on host:port (port 0: any free port) without TLS. Throws
  // Error(kIo) when the address cannot be bound.
  GrpcServer(const std::string& host, int port, grpc::Service& service);
  ~GrpcServer();
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  int port() const { return port_; }
  // The health status of the whole server ("") and of lazykv.v1.Lazykv:
  // SERVING or NOT_SERVING. SERVING from the start.
  void set_serving(bool serving);
  // Stops accepting calls, lets running ones finish until `deadline`, then
  // cancels the rest and waits for their handlers to return. Idempotent.
  void shutdown(std::chrono::steady_clock::time_point deadline);

 private:
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool stopped_ = false;
};

}  // namespace lazykv
