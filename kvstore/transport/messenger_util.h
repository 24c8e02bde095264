// Pieces the Server and the Client share: address resolution, registered
// memory lookup, and the parameters of an AM send or receive.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvstore/transport/ucx_handles.h"

namespace lazykv::transport {

// host:port as a socket address (numeric or a name). Error(code) if it does
// not resolve.
sockaddr_storage resolve_address(const std::string& host, uint16_t port, ErrorCode code);
// "ip:port" of a socket address, for logs and errors.
std::string address_text(const sockaddr_storage& address);

// Memory registered with ucp_mem_map, searched by address so transfers from
// or into it pass the memory handle to UCX instead of registering per call.
class RegisteredMemory {
 public:
  void add(ucp_context_h context, std::span<uint8_t> memory);
  ucp_mem_h find(const void* p, size_t bytes) const;  // nullptr if not registered
  void clear() { regions_.clear(); }

 private:
  std::vector<std::unique_ptr<UcxMemory>> regions_;
};

// Parameters for ucp_am_send_nbx: a callback with `user_data`, the given AM
// flags, and the memory handle when the payload lies in registered memory.
ucp_request_param_t am_send_param(ucp_send_nbx_callback_t callback, void* user_data, uint32_t flags, ucp_mem_h memh);
// Parameters for ucp_am_recv_data_nbx.
ucp_request_param_t am_recv_param(ucp_am_recv_data_nbx_callback_t callback, void* user_data, ucp_mem_h memh);

// Registers `callback(arg)` for AM id `id` on `worker`.
void set_am_handler(ucp_worker_h worker, unsigned id, ucp_am_recv_callback_t callback, void* arg);

// Message for a lost peer: "kvstore peer <peer> lost: <status>".
std::string peer_lost_message(const std::string& peer, ucs_status_t status);

}  // namespace lazykv::transport
