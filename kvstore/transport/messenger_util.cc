#include "kvstore/transport/messenger_util.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstring>

namespace lazykv::transport {

sockaddr_storage resolve_address(const std::string& host, uint16_t port, ErrorCode code) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (host.empty() ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw Error(code, "cannot resolve kvstore address '" + host + ":" + service + "': " + gai_strerror(rc));
  }
  sockaddr_storage out{};
  std::memcpy(&out, found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);
  return out;
}

std::string address_text(const sockaddr_storage& address) {
  char ip[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (address.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
    port = ntohs(in->sin_port);
    std::string out = ip;
    out += ":";
    out += std::to_string(port);
    return out;
  }
  if (address.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
    port = ntohs(in6->sin6_port);
    std::string out = "[";
    out += ip;
    out += "]:";
    out += std::to_string(port);
    return out;
  }
  return "unknown";
}

void RegisteredMemory::add(ucp_context_h context, std::span<uint8_t> memory) {
  if (memory.empty()) return;
  regions_.push_back(std::make_unique<UcxMemory>(context, memory));
}

ucp_mem_h RegisteredMemory::find(const void* p, size_t bytes) const {
  for (const auto& region : regions_) {
    if (region->contains(p, bytes)) return region->get();
  }
  return nullptr;
}

ucp_request_param_t am_send_param(ucp_send_nbx_callback_t callback, void* user_data, uint32_t flags, ucp_mem_h memh) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = callback;
  param.user_data = user_data;
  param.flags = flags;
  if (memh != nullptr) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    param.memh = memh;
  }
  return param;
}

ucp_request_param_t am_recv_param(ucp_am_recv_data_nbx_callback_t callback, void* user_data, ucp_mem_h memh) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.recv_am = callback;
  param.user_data = user_data;
  if (memh != nullptr) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    param.memh = memh;
  }
  return param;
}

void set_am_handler(ucp_worker_h worker, unsigned id, ucp_am_recv_callback_t callback, void* arg) {
  ucp_am_handler_param_t param{};
  param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                     UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  param.id = id;
  param.cb = callback;
  param.arg = arg;
  param.flags = UCP_AM_FLAG_WHOLE_MSG;
  check_ucs(ucp_worker_set_am_recv_handler(worker, &param), "ucp_worker_set_am_recv_handler");
}

std::string peer_lost_message(const std::string& peer, ucs_status_t status) {
  return "kvstore peer " + peer + " lost: " + ucs_status_string(status);
}

}  // namespace lazykv::transport
