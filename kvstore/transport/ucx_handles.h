// Owning wrappers for the UCX handles the transport uses, so that no error
// path leaks a context, worker, listener, endpoint, registration or request.
// Every ucs_status_t goes through check_ucs, which turns a failure into a
// lazykv::Error naming the call.
#pragma once

#include <ucp/api/ucp.h>

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/error.h"

namespace lazykv::transport {

// Throws Error(code, "<what>: <ucs_status_string>") unless status is UCS_OK.
void check_ucs(ucs_status_t status, std::string_view what, ErrorCode code = ErrorCode::kIo);

// ucp_config_read / ucp_config_release.
class UcxConfig {
 public:
  UcxConfig();
  ~UcxConfig();
  UcxConfig(const UcxConfig&) = delete;
  UcxConfig& operator=(const UcxConfig&) = delete;
  void set(const char* name, const std::string& value);  // ucp_config_modify
  // A UCP option's value as configured (environment, ucx.conf, set), e.g.
  // value("TLS") == "all"; empty when it is not printed.
  std::string value(const char* name) const;
  ucp_config_t* get() const { return config_; }

 private:
  ucp_config_t* config_ = nullptr;
};

// ucp_init / ucp_cleanup.
class UcxContext {
 public:
  UcxContext(const UcxConfig& config, const ucp_params_t& params);
  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;
  ucp_context_h get() const { return context_; }

 private:
  ucp_context_h context_ = nullptr;
};

// ucp_worker_create / ucp_worker_destroy.
class UcxWorker {
 public:
  UcxWorker(ucp_context_h context, const ucp_worker_params_t& params);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;
  ucp_worker_h get() const { return worker_; }

 private:
  ucp_worker_h worker_ = nullptr;
};

// ucp_listener_create / ucp_listener_destroy.
class UcxListener {
 public:
  UcxListener(ucp_worker_h worker, const ucp_listener_params_t& params);
  ~UcxListener();
  UcxListener(const UcxListener&) = delete;
  UcxListener& operator=(const UcxListener&) = delete;
  ucp_listener_h get() const { return listener_; }
  uint16_t port() const;  // the port it listens on (resolves port 0)

 private:
  ucp_listener_h listener_ = nullptr;
};

// ucp_mem_map / ucp_mem_unmap.
class UcxMemory {
 public:
  UcxMemory(ucp_context_h context, std::span<uint8_t> memory);
  ~UcxMemory();
  UcxMemory(const UcxMemory&) = delete;
  UcxMemory& operator=(const UcxMemory&) = delete;
  ucp_mem_h get() const { return memh_; }
  bool contains(const void* p, size_t bytes) const;

 private:
  ucp_context_h context_;
  ucp_mem_h memh_ = nullptr;
  const uint8_t* begin_ = nullptr;
  size_t bytes_ = 0;
};

// A request handle returned by a *_nbx call; ucp_request_free on release.
struct UcxRequestFree {
  void operator()(void* request) const {
    if (request != nullptr) ucp_request_free(request);
  }
};
using UcxRequest = std::unique_ptr<void, UcxRequestFree>;

// What a *_nbx call returned: done now (ok), failed now, or pending (request).
struct NbxResult {
  ucs_status_t status = UCS_OK;  // UCS_INPROGRESS when `request` is set
  UcxRequest request;
};
NbxResult take_nbx(ucs_status_ptr_t result);

// An endpoint. Closing needs progress, so the owner closes it explicitly
// (close_nbx, then progress until the request completes); the destructor
// only force-closes an endpoint that was never closed, progressing `worker`
// until UCX lets go of it, as a last resort on error paths.
class UcxEndpoint {
 public:
  UcxEndpoint(ucp_worker_h worker, const ucp_ep_params_t& params);
  ~UcxEndpoint();
  UcxEndpoint(const UcxEndpoint&) = delete;
  UcxEndpoint& operator=(const UcxEndpoint&) = delete;
  ucp_ep_h get() const { return ep_; }
  // Starts closing (UCP_EP_CLOSE_FLAG_FORCE when `force`); the endpoint is
  // unusable afterwards. The request, if any, completes during progress.
  NbxResult close(bool force);

 private:
  ucp_worker_h worker_;
  ucp_ep_h ep_ = nullptr;
};

}  // namespace lazykv::transport
