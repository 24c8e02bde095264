// How TransportOptions become UCX configuration, and how the transport UCX
// picked for an endpoint is found, named and reported.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvstore/transport/messenger.h"
#include "kvstore/transport/ucx_handles.h"

namespace lazykv::transport {

// UCX's memory hooks (UCX_MEM_MALLOC_HOOKS, UCX_MEM_EVENTS) are global UCM
// options that libucs reads when it is loaded, before main, so a process
// cannot turn them off for itself with setenv or ucp_config_modify. The
// transport does not depend on them (it registers memory explicitly or per
// transfer); under AddressSanitizer they did not conflict in our runs, and a
// deployment that needs them off sets the variables in the environment.

// TLS (transports; the sockaddr connection manager needs tcp, so "tcp" is
// appended when shm alone was asked for: see below; "^shm" for a peer in
// another network namespace, see TransportOptions), KEEPALIVE_INTERVAL
// (a quarter of peer_timeout) and the tcp socket keepalive.
//
// When shared memory is enabled it also turns on what UCX 1.13 needs to use
// shm under UCP_ERR_HANDLING_MODE_PEER (which every endpoint here uses):
//  - MM_ERROR_HANDLING=y: posix/sysv do support peer-failure detection
//    (an endpoint check on the peer process; keepalive runs over it) but only
//    advertise it when asked. Without it wireup drops them, and the endpoint
//    stays on tcp even between two processes on one host.
//  - MEMORY_INVALIDATE=y (cma): rendezvous lanes under peer-failure handling
//    must invalidate registered memory; cma registrations are no-ops, so
//    there is nothing to invalidate, but UCX only selects cma for rendezvous
//    when the capability is advertised. (A peer declared dead while still
//    running could in principle still read or write a transfer's buffer; the
//    transport declares a peer dead only on an endpoint error, a dead
//    process, or a transfer stuck for a full peer_timeout past its deadline.)
// Both are UCT options, passed to ucp_config_modify, which hands them to the
// md/iface configurations of the context.
void apply_transport_options(UcxConfig& config, const TransportOptions& options);

// Whether an address belongs to this network namespace: loopback,
// unspecified, or an address of one of its interfaces.
bool address_in_this_network_namespace(const sockaddr_storage& address);

// UCX_TLS with what the listener/connector needs added: UCX 1.13 connects
// through the sockaddr connection manager (tcp sockcm), which is only
// available when a tcp resource is enabled.
std::string effective_tls(std::string_view requested);

// Transport layer names of an endpoint's lanes ("posix", "cma", "tcp"...),
// parsed from ucp_ep_print_info: UCX 1.13 has no UCP_EP_ATTR_FIELD_TRANSPORTS.
std::vector<std::string> endpoint_lane_transports(ucp_ep_h ep);

// A UCX transport layer name as a class: "shm", "tcp", "rdma", "cuda",
// "rocm", "self", or the name itself.
std::string transport_class(std::string_view tl_name);

// The class that carries the endpoint's traffic: the fastest class among
// its lanes (rdma > shm > cuda > rocm > tcp > self); "unknown" if none.
std::string primary_transport(const std::vector<std::string>& lane_transports);

// True when `requested` (UCX_TLS syntax) asks for shared memory or RDMA, so
// that ending up on tcp is a fallback worth a warning.
bool requests_fast_transport(std::string_view requested);

// True when `requested` leaves shared memory enabled: empty (UCX chooses),
// "all", a shm transport named, or a "^" list that does not exclude shm.
// Only then are the shm options of apply_transport_options set.
bool enables_shared_memory(std::string_view requested);

// Identifies the machine (kernel boot id + host name), so that two peers can
// tell whether they share a host, i.e. whether shared memory could have
// reached the other. UCX alone decides whether it does (namespaces...).
std::string host_identity();
// host_identity() hashed (FNV-1a), as the hello carries it.
uint64_t host_identity_hash();

// Logs "[transport] peer <peer> via <transport> (<lanes>)" to stderr, and a
// warning when `transport` is tcp though `requested` asked for a faster
// transport that could have reached this peer: RDMA, or shared memory for a
// peer on the same host (shm never reaches another host; that is no fallback).
void log_endpoint_transport(const std::string& peer, const std::string& transport,
                            const std::vector<std::string>& lanes, std::string_view requested,
                            bool same_host);

// Whether log_endpoint_transport warns: tcp chosen although `requested` asks
// for RDMA, or for shm and the peer is on this host.
bool is_transport_fallback(const std::string& transport, std::string_view requested, bool same_host);

}  // namespace lazykv::transport
