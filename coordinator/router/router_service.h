// `lazykv router`'s HTTP handler: the OpenAI API of several replicas
// (`lazykv serve` or `lazykv coordinator`, one per tensor-parallel group)
// behind one address. Each request is bound to a replica by ReplicaSet's
// rule and proxied (upstream.h), its answer naming the replica in an
// `x-lazykv-replica` header; the router's own paths are /health, /ready
// (some replica is up), /metrics and /router/replicas (JSON state).
//
// Generation requests (POST /v1/completions, /v1/chat/completions) wait for
// a replica's slot; the others go to the up replica with the fewest requests.
//
// Failures: a replica that cannot be reached before it takes a request
// loses it to another replica (retried, the client sees nothing); a
// replica that fails after taking it ends it with a clear 502 error (an SSE
// error event if the stream had started), since it may have run already.
// Either way the replica is marked down until its readiness probe passes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics/registry.h"
#include "coordinator/http/http_server.h"
#include "coordinator/router/replica_set.h"
#include "coordinator/router/upstream.h"

namespace lazykv::router {

struct RouterOptions {
  std::vector<std::string> replicas;  // HOST:PORT of each replica's HTTP API
  ReplicaSetOptions set;
  UpstreamOptions upstream;
  std::chrono::milliseconds health_interval{1'000};  // readiness probe period (and timeout)
  std::chrono::milliseconds queue_timeout{60'000};   // longest wait for a replica's free slot
  int64_t default_max_tokens = 256;  // the token estimate of a request that names no max_tokens
};

class RouterService {
 public:
  // Throws Error(kInvalidArgument) for a replica that is not HOST:PORT.
  RouterService(RouterOptions options, metrics::Registry& registry);
  ~RouterService();  // stops the probes
  RouterService(const RouterService&) = delete;
  RouterService& operator=(const RouterService&) = delete;

  void handle(const http::Request& request, http::ResponseWriter& out);
  // Starts one readiness-probe thread per replica.
  void start_probes();
  // Draining: /ready answers 503 and new requests are refused.
  void set_draining() { draining_ = true; }
  int in_flight() const { return in_flight_.load(); }
  ReplicaSet& replicas() { return set_; }

 private:
  struct Address {
    std::string host;
    uint16_t port;
  };
  static constexpr const char* kNoReplica = "none";  // the replica label of the router's own answers
  void route_generation(const http::Request& request, http::ResponseWriter& out);
  void route_other(const http::Request& request, http::ResponseWriter& out);
  // One attempt on replica `r`: the proxy, then the replica's health, the
  // metrics and (when the replica failed after taking it) the client's 502.
  UpstreamResult forward_to(int r, const http::Request& request, http::ResponseWriter& out);
  void answer_error(http::ResponseWriter& out, int status, const std::string& replica, const std::string& message);
  void probe_loop(int replica);
  void mark_down(int replica, const std::string& why);

  RouterOptions options_;
  metrics::Registry& registry_;
  std::vector<Address> addresses_;
  ReplicaSet set_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  std::vector<std::thread> probes_;
};

}  // namespace lazykv::router
