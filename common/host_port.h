// HOST:PORT addresses as flags and peers give them.
#pragma once

#include <string>
#include <utility>

namespace lazykv {

// "host:port" or "[v6]:port" -> (host, port); throws Error(kInvalidArgument)
// naming `what` (a flag, say) when it is not HOST:PORT with a port in
// [0, 65535].
std::pair<std::string, int> parse_host_port(const std::string& address, const std::string& what);

// True for an address a server binds to mean "every interface" (0.0.0.0,
// ::, or empty): a peer cannot connect to it and must use another name.
bool is_wildcard_host(const std::string& host);

// The first IPv4 address `host` (a name or a literal) resolves to, dotted;
// empty when it has none or does not resolve.
std::string ipv4_address_of(const std::string& host);

}  // namespace lazykv
