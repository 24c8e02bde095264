// Counts every call of the lazykv.v1 API in lazykv_requests_total (and
// lazykv_errors_total when it fails), whichever layer ends it: the method
// itself, or gRPC before the method runs. A request whose bytes do not parse
// as its message (a string field holding invalid UTF-8, a truncated field)
// reaches no method, and gRPC would answer INTERNAL with no message, as if
// the server had failed: such calls get INVALID_ARGUMENT saying why.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <string>

#include "common/metrics/registry.h"

namespace lazykv {

class CallAccountingFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallAccountingFactory(metrics::Registry& metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override;

 private:
  metrics::Registry& metrics_;
};

}  // namespace lazykv
