#include "kvstore/transport/ucx_handles.h"

#include <netinet/in.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <chrono>

namespace lazykv::transport {

void check_ucs(ucs_status_t status, std::string_view what, ErrorCode code) {
  if (status == UCS_OK) return;
  throw Error(code, std::string(what) + ": " + ucs_status_string(status));
}

UcxConfig::UcxConfig() { check_ucs(ucp_config_read(nullptr, nullptr, &config_), "ucp_config_read"); }
UcxConfig::~UcxConfig() { ucp_config_release(config_); }

void UcxConfig::set(const char* name, const std::string& value) {
  check_ucs(ucp_config_modify(config_, name, value.c_str()),
            std::string("ucp_config_modify(") + name + "=" + value + ")", ErrorCode::kInvalidArgument);
}

std::string UcxConfig::value(const char* name) const {
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return {};
  ucp_config_print(config_, stream, nullptr, UCS_CONFIG_PRINT_CONFIG);
  std::fclose(stream);
  const std::string printed(text == nullptr ? "" : text, size);
  std::free(text);
  const std::string key = std::string("UCX_") + name + "=";
  for (size_t at = 0; at < printed.size();) {
    const size_t end = std::min(printed.find('\n', at), printed.size());
    if (printed.compare(at, key.size(), key) == 0) return printed.substr(at + key.size(), end - at - key.size());
    at = end + 1;
  }
  return {};
}

UcxContext::UcxContext(const UcxConfig& config, const ucp_params_t& params) {
  check_ucs(ucp_init(&params, config.get(), &context_), "ucp_init");
}
UcxContext::~UcxContext() { ucp_cleanup(context_); }

UcxWorker::UcxWorker(ucp_context_h context, const ucp_worker_params_t& params) {
  check_ucs(ucp_worker_create(context, &params, &worker_), "ucp_worker_create");
}
UcxWorker::~UcxWorker() { ucp_worker_destroy(worker_); }

UcxListener::UcxListener(ucp_worker_h worker, const ucp_listener_params_t& params) {
  check_ucs(ucp_listener_create(worker, &params, &listener_), "ucp_listener_create");
}
UcxListener::~UcxListener() { ucp_listener_destroy(listener_); }

uint16_t UcxListener::port() const {
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  check_ucs(ucp_listener_query(listener_, &attr), "ucp_listener_query");
  if (attr.sockaddr.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&attr.sockaddr)->sin6_port);
  }
  return ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
}

UcxMemory::UcxMemory(ucp_context_h context, std::span<uint8_t> memory)
    : context_(context), begin_(memory.data()), bytes_(memory.size()) {
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = memory.data();
  params.length = memory.size();
  check_ucs(ucp_mem_map(context, &params, &memh_), "ucp_mem_map");
}
UcxMemory::~UcxMemory() { ucp_mem_unmap(context_, memh_); }

bool UcxMemory::contains(const void* p, size_t bytes) const {
  const auto* b = static_cast<const uint8_t*>(p);
  return b >= begin_ && bytes <= bytes_ && b - begin_ <= static_cast<std::ptrdiff_t>(bytes_ - bytes);
}

NbxResult take_nbx(ucs_status_ptr_t result) {
  NbxResult out;
  if (result == nullptr) return out;
  if (UCS_PTR_IS_ERR(result)) {
    out.status = UCS_PTR_STATUS(result);
    return out;
  }
  out.status = UCS_INPROGRESS;
  out.request.reset(result);
  return out;
}

UcxEndpoint::UcxEndpoint(ucp_worker_h worker, const ucp_ep_params_t& params) : worker_(worker) {
  check_ucs(ucp_ep_create(worker, &params, &ep_), "ucp_ep_create", ErrorCode::kUnavailable);
}

NbxResult UcxEndpoint::close(bool force) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucp_ep_h ep = ep_;
  ep_ = nullptr;
  if (ep == nullptr) return {};
  return take_nbx(ucp_ep_close_nbx(ep, &param));
}

UcxEndpoint::~UcxEndpoint() {
  if (ep_ == nullptr) return;
  NbxResult closing = close(/*force=*/true);
  // A forced close completes locally; bound the wait anyway so a broken
  // transport cannot hang a destructor.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (closing.request && ucp_request_check_status(closing.request.get()) == UCS_INPROGRESS &&
         std::chrono::steady_clock::now() < deadline) {
    ucp_worker_progress(worker_);
  }
}

}  // namespace lazykv::transport
