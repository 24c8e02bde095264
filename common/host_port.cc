#include "common/host_port.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstdlib>

#include "common/error.h"

namespace lazykv {

std::pair<std::string, int> parse_host_port(const std::string& address, const std::string& what) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw Error(ErrorCode::kInvalidArgument, what + " '" + address + "' is not HOST:PORT");
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port_text = address.substr(colon + 1);
  char* end = nullptr;
  const long port = std::strtol(port_text.c_str(), &end, 10);
  if (port_text.empty() || *end != '\0' || port < 0 || port > 65535) {
    throw Error(ErrorCode::kInvalidArgument, what + " '" + address + "': the port must be in [0, 65535]");
  }
  return {host, int(port)};
}

bool is_wildcard_host(const std::string& host) { return host.empty() || host == "0.0.0.0" || host == "::"; }

std::string ipv4_address_of(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return "";
  char text[INET_ADDRSTRLEN] = {};
  const auto* v4 = reinterpret_cast<const sockaddr_in*>(found->ai_addr);
  const bool ok = inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text) != nullptr;
  freeaddrinfo(found);
  return ok ? text : "";
}

}  // namespace lazykv
