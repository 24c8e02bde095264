// A started gRPC server offering one service plus the standard health
// service (grpc.health.v1), the one way every lazykv role serves gRPC: the
// coordinator's public API, the worker's step protocol, the kvstore's
// control plane. Stopped (at once) when destroyed, unless shutdown() was
// called before.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace lazykv {

class GrpcServer {
 public:
  using Interceptors = std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>;

  // Listens on host:port (port 0: any free port) without TLS. `service_name`
  // is the service's full proto name, reported by the health service.
  // `max_message_bytes` > 0 raises gRPC's message limit both ways.
  // `interceptors` see every call (GrpcApi counts its calls with one).
  // Throws Error(kIo) when the address cannot be bound (also when another
  // server holds the port: SO_REUSEPORT is off).
  GrpcServer(const std::string& host, int port, grpc::Service& service, std::string service_name,
             int max_message_bytes = 0, Interceptors interceptors = {});
  ~GrpcServer();
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  int port() const { return port_; }
  // The health status of the whole server ("") and of the service:
  // SERVING or NOT_SERVING. SERVING from the start.
  void set_serving(bool serving);
  // Stops accepting calls, lets running ones finish until `deadline`, then
  // cancels the rest and waits for their handlers to return. Idempotent.
  void shutdown(std::chrono::steady_clock::time_point deadline);

 private:
  std::unique_ptr<grpc::Server> server_;
  std::string service_name_;
  int port_ = 0;
  bool stopped_ = false;
};

}  // namespace lazykv
