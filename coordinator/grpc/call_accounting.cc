#include "coordinator/grpc/call_accounting.h"

#include <string_view>

#include "common/metrics/metric_names.h"

namespace lazykv {
namespace {

using grpc::experimental::InterceptionHookPoints;

// The name gRPC gives a status code, as the metrics' `code`.
const char* code_name(grpc::StatusCode code) {
  switch (code) {
    case grpc::OK: return "OK";
    case grpc::CANCELLED: return "CANCELLED";
    case grpc::UNKNOWN: return "UNKNOWN";
    case grpc::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::NOT_FOUND: return "NOT_FOUND";
    case grpc::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::ABORTED: return "ABORTED";
    case grpc::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::INTERNAL: return "INTERNAL";
    case grpc::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::DATA_LOSS: return "DATA_LOSS";
    case grpc::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNKNOWN";
  }
}

// The metrics `type` of a failed call, as the HTTP service names its statuses.
const char* error_type(grpc::StatusCode code) {
  switch (code) {
    case grpc::UNAUTHENTICATED: return "authentication";
    case grpc::RESOURCE_EXHAUSTED: return "rate_limited";
    case grpc::UNAVAILABLE: return "overloaded";
    case grpc::CANCELLED: return "cancelled";
    case grpc::INTERNAL:
    case grpc::UNKNOWN: return "internal";
    default: return "invalid_request";
  }
}

// The metrics `endpoint` of a lazykv.v1 method; nullptr for other services
// (grpc.health.v1), which are not counted.
const char* endpoint_of(std::string_view method) {
  if (method == "/lazykv.v1.Lazykv/Generate") return "grpc_generate";
  if (method == "/lazykv.v1.Lazykv/ListModels") return "grpc_list_models";
  if (method.starts_with("/lazykv.v1.")) return "grpc_other";
  return nullptr;
}

class CallAccounting final : public grpc::experimental::Interceptor {
 public:
  CallAccounting(metrics::Registry& metrics, const char* endpoint) : metrics_(metrics), endpoint_(endpoint) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    // With no message at this point the request's bytes did not parse.
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsed_ = true;
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      grpc::Status status = methods->GetSendStatus();
      if (unparsed_ && status.error_code() == grpc::INTERNAL) {
        status = grpc::Status(grpc::INVALID_ARGUMENT,
                              "the request is not a valid message of this method: malformed bytes, or a string "
                              "field that is not valid UTF-8 (send text as UTF-8, or token ids)");
        methods->ModifySendStatus(status);
      }
      if (endpoint_ != nullptr) {
        metrics_.counter(metrics::kRequests, {endpoint_, code_name(status.error_code())}).inc();
        if (!status.ok()) metrics_.counter(metrics::kErrors, {error_type(status.error_code())}).inc();
      }
    }
    methods->Proceed();
  }

 private:
  metrics::Registry& metrics_;
  const char* endpoint_;
  bool unparsed_ = false;
};

}  // namespace

grpc::experimental::Interceptor* CallAccountingFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new CallAccounting(metrics_, endpoint_of(info->method()));
}

}  // namespace lazykv
