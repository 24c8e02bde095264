#include "kvstore/transport/transport_config.h"

#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

namespace lazykv::transport {

namespace {

std::vector<std::string> split_tls(std::string_view tls) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= tls.size()) {
    const size_t comma = tls.find(',', start);
    const size_t end = comma == std::string_view::npos ? tls.size() : comma;
    if (end > start) out.emplace_back(tls.substr(start, end - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string milliseconds_text(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + "ms"; }

}  // namespace

namespace {

bool same_ip(const sockaddr* a, const sockaddr_storage& b) {
  if (a->sa_family != b.ss_family) return false;
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(&b)->sin_addr.s_addr;
  }
  if (a->sa_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(&b)->sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
}

}  // namespace

bool address_in_this_network_namespace(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    const uint32_t ip = ntohl(reinterpret_cast<const sockaddr_in*>(&address)->sin_addr.s_addr);
    if ((ip >> 24) == 127 || ip == INADDR_ANY) return true;
  } else if (address.ss_family == AF_INET6) {
    const in6_addr& ip = reinterpret_cast<const sockaddr_in6*>(&address)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&ip) || IN6_IS_ADDR_UNSPECIFIED(&ip)) return true;
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return true;  // unknown: leave UCX's choice alone
  bool found = false;
  for (const ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
    found = i->ifa_addr != nullptr && same_ip(i->ifa_addr, address);
  }
  freeifaddrs(list);
  return found;
}

std::string effective_tls(std::string_view requested) {
  if (requested.empty()) return {};
  bool has_tcp = false;
  bool negated = false;
  for (const auto& tl : split_tls(requested)) {
    if (tl == "tcp" || tl == "all") has_tcp = true;
    if (!tl.empty() && tl[0] == '^') negated = true;
  }
  if (has_tcp || negated) return std::string(requested);
  return std::string(requested) + ",tcp";
}

void apply_transport_options(UcxConfig& config, const TransportOptions& options) {
  const std::string tls = effective_tls(options.transports);
  if (!tls.empty()) {
    config.set("TLS", tls);
  } else if (options.peer_in_other_namespace && config.value("TLS") == "all") {
    config.set("TLS", "^shm");
  }
  const auto interval = std::max(options.peer_timeout / 4, std::chrono::milliseconds(50));
  config.set("KEEPALIVE_INTERVAL", milliseconds_text(interval));
  // Let every endpoint be checked each keepalive round (default: 128 per round).
  config.set("KEEPALIVE_NUM_EPS", "inf");
  if (enables_shared_memory(options.transports)) {
    config.set("MM_ERROR_HANDLING", "y");  // posix, sysv (see the header)
    config.set("MEMORY_INVALIDATE", "y");  // cma
  }
}

std::vector<std::string> endpoint_lane_transports(ucp_ep_h ep) {
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return {};
  ucp_ep_print_info(ep, stream);
  std::fclose(stream);
  std::string info(text == nullptr ? "" : text, size);
  if (std::getenv("LAZYKV_TRANSPORT_DEBUG") != nullptr) std::fprintf(stderr, "%s\n", info.c_str());
  std::free(text);

  // Lines look like "#   lane[0]:  3:tcp/lo.0 md[1] ... -> ... am am_bw#0":
  // the transport is between the "<index>:" and the "/".
  std::vector<std::string> out;
  std::istringstream lines(info);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t lane = line.find("lane[");
    if (lane == std::string::npos) continue;
    const size_t colon = line.find(':', lane);
    if (colon == std::string::npos) continue;
    std::istringstream fields(line.substr(colon + 1));
    std::string resource;
    fields >> resource;  // "3:tcp/lo.0"
    const size_t idx = resource.find(':');
    const size_t slash = resource.find('/');
    if (idx == std::string::npos || slash == std::string::npos || slash < idx) continue;
    std::string tl = resource.substr(idx + 1, slash - idx - 1);
    bool seen = false;
    for (const auto& t : out) seen = seen || t == tl;
    if (!seen) out.push_back(tl);
  }
  return out;
}

std::string transport_class(std::string_view tl) {
  if (tl == "posix" || tl == "sysv" || tl == "cma" || tl == "knem" || tl == "xpmem" || tl == "mm" || tl == "shm" ||
      tl == "sm") {
    return "shm";
  }
  if (tl == "tcp") return "tcp";
  if (tl.starts_with("rc") || tl.starts_with("ud") || tl.starts_with("dc") || tl == "ib") return "rdma";
  if (tl.starts_with("cuda") || tl == "gdr_copy") return "cuda";
  if (tl.starts_with("rocm")) return "rocm";
  if (tl == "self") return "self";
  return std::string(tl);
}

std::string primary_transport(const std::vector<std::string>& lanes) {
  static constexpr std::string_view kOrder[] = {"rdma", "shm", "cuda", "rocm", "tcp", "self"};
  std::set<std::string> classes;
  for (const auto& tl : lanes) classes.insert(transport_class(tl));
  for (auto c : kOrder) {
    if (classes.contains(std::string(c))) return std::string(c);
  }
  return classes.empty() ? "unknown" : *classes.begin();
}

bool requests_fast_transport(std::string_view requested) {
  for (const auto& tl : split_tls(requested)) {
    if (tl.empty() || tl[0] == '^') continue;
    const std::string c = transport_class(tl);
    if (c == "shm" || c == "rdma") return true;
  }
  return false;
}

bool enables_shared_memory(std::string_view requested) {
  const auto tls = split_tls(requested);
  if (tls.empty()) return true;
  bool negated_list = false;
  for (const auto& tl : tls) {
    const bool negated = tl[0] == '^';
    negated_list = negated_list || negated;
    const std::string_view name = negated ? std::string_view(tl).substr(1) : std::string_view(tl);
    const bool shm = name == "all" || transport_class(name) == "shm";
    if (shm) return !negated;
  }
  return negated_list;
}

std::string host_identity() {
  std::string boot_id;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::getline(boot, boot_id);
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) name[0] = '\0';
  return boot_id + "/" + name;
}

uint64_t host_identity_hash() {
  static const uint64_t hash = [] {
    // FNV-1a: stable across processes and builds (std::hash need not be).
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char c : host_identity()) {
      h ^= static_cast<uint8_t>(c);
      h *= 0x100000001b3ull;
    }
    return h;
  }();
  return hash;
}

bool is_transport_fallback(const std::string& transport, std::string_view requested, bool same_host) {
  if (transport != "tcp") return false;
  bool rdma = false;
  bool shm = false;
  for (const auto& tl : split_tls(requested)) {
    if (tl.empty() || tl[0] == '^') continue;
    const std::string c = transport_class(tl);
    rdma = rdma || c == "rdma";
    shm = shm || c == "shm";
  }
  return rdma || (shm && same_host);
}

void log_endpoint_transport(const std::string& peer, const std::string& transport,
                            const std::vector<std::string>& lanes, std::string_view requested,
                            bool same_host) {
  std::string lane_list;
  for (const auto& tl : lanes) lane_list += (lane_list.empty() ? "" : ",") + tl;
  std::cerr << "[transport] peer " << peer << " via " << transport << " (" << lane_list << ")"
            << (same_host ? "" : ", another host") << "\n";
  if (is_transport_fallback(transport, requested, same_host)) {
    std::cerr << "[transport] warning: peer " << peer << " fell back to tcp although '" << requested
              << "' was requested (shared memory / RDMA unavailable for this peer)\n";
  }
}

}  // namespace lazykv::transport
