#include "common/rpc/grpc_server.h"

#include <grpcpp/health_check_service_interface.h>

#include <algorithm>

#include "common/error.h"

namespace lazykv {

GrpcServer::GrpcServer(const std::string& host, int port, grpc::Service& service, std::string service_name,
                       int max_message_bytes, Interceptors interceptors)
    : service_name_(std::move(service_name)) {
  if (port < 0 || port > 65535) throw Error(ErrorCode::kInvalidArgument, "the port must be in [0, 65535]");
  // IPv6 literals need brackets in a gRPC address.
  const std::string address =
      (host.find(':') != std::string::npos && host.front() != '[' ? "[" + host + "]" : host) + ":" +
      std::to_string(port);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // Without this, Linux lets a second server bind the same port and share its calls.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
  if (max_message_bytes > 0) {
    builder.SetMaxReceiveMessageSize(max_message_bytes);
    builder.SetMaxSendMessageSize(max_message_bytes);
  }
  builder.RegisterService(&service);
  if (!interceptors.empty()) builder.experimental().SetInterceptorCreators(std::move(interceptors));
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    if (server_) server_->Shutdown();
    throw Error(ErrorCode::kIo, "cannot listen for gRPC on " + address);
  }
  set_serving(true);
}

GrpcServer::~GrpcServer() { shutdown(std::chrono::steady_clock::now()); }

void GrpcServer::set_serving(bool serving) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus("", serving);
  health->SetServingStatus(service_name_, serving);
}

void GrpcServer::shutdown(std::chrono::steady_clock::time_point deadline) {
  if (stopped_) return;
  stopped_ = true;
  // gRPC's deadlines are on the system clock.
  const auto left = std::chrono::duration_cast<std::chrono::system_clock::duration>(
      deadline - std::chrono::steady_clock::now());
  server_->Shutdown(std::chrono::system_clock::now() + std::max(left, std::chrono::system_clock::duration::zero()));
  server_->Wait();
}

}  // namespace lazykv
