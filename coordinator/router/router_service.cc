#include "coordinator/router/router_service.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/host_port.h"
#include "common/metrics/metric_names.h"
#include "coordinator/api/openai_response.h"
#include "coordinator/http/sse.h"

namespace lazykv::router {
namespace {

constexpr auto kProbeTick = std::chrono::milliseconds(50);  // how soon a stopping probe thread notices
constexpr int64_t kBytesPerToken = 4;                        // the token estimate of prompt text

// Generation requests hold a replica's slot; the rest (model lists,
// tokenize) are quick and go to any replica that is up.
bool takes_a_slot(const http::Request& request) {
  return request.method == "POST" && (request.path == "/v1/completions" || request.path == "/v1/chat/completions");
}

// What the router reads of a request body: the prefix keys of its prompt
// text and its token estimate. A body that is not JSON gets neither; the
// replica answers it (with its own 400).
RouteRequest describe(const http::Request& request, int64_t default_max_tokens) {
  RouteRequest route;
  route.tokens = default_max_tokens;
  if (request.method != "POST") return route;
  const nlohmann::json body = nlohmann::json::parse(request.body, nullptr, false);
  if (!body.is_object()) return route;
  std::string text;
  if (const auto it = body.find("messages"); it != body.end()) text = it->dump();
  else if (const auto p = body.find("prompt"); p != body.end()) text = p->is_string() ? p->get<std::string>() : p->dump();
  const auto model = body.find("model");
  route.keys = prefix_keys(model != body.end() && model->is_string() ? model->get<std::string>() : "", text);
  int64_t max_tokens = default_max_tokens;
  for (const char* name : {"max_completion_tokens", "max_tokens"}) {
    const auto it = body.find(name);
    if (it != body.end() && it->is_number_integer()) {
      max_tokens = std::clamp<int64_t>(it->get<int64_t>(), 0, int64_t(1) << 24);
      break;
    }
  }
  int64_t n = 1;
  if (const auto it = body.find("n"); it != body.end() && it->is_number_integer()) n = std::clamp<int64_t>(it->get<int64_t>(), 1, 128);
  route.tokens = int64_t(text.size()) / kBytesPerToken + n * max_tokens;
  return route;
}

std::string failure_message(AcquireFailure failure, std::chrono::milliseconds queue_timeout) {
  switch (failure) {
    case AcquireFailure::kNoReplicaUp: return "no replica is up; retry later";
    case AcquireFailure::kEveryReplicaFailed: return "every replica that is up failed to take the request; retry later";
    case AcquireFailure::kQueueFull: return "the router's queue is full; retry later";
    case AcquireFailure::kTimedOut:
      return "no replica had a free slot within " + std::to_string(queue_timeout.count() / 1000) + " s; retry later";
    case AcquireFailure::kCancelled: return "the client went away";
  }
  return "";
}

RouterOptions with_metrics(RouterOptions options, metrics::Registry& registry) {
  options.set.metrics = &registry;
  return options;
}

}  // namespace

RouterService::RouterService(RouterOptions options, metrics::Registry& registry)
    : options_(with_metrics(std::move(options), registry)), registry_(registry), set_(options_.replicas, options_.set) {
  if (options_.replicas.empty()) throw Error(ErrorCode::kInvalidArgument, "router: give at least one --replica");
  for (const std::string& replica : options_.replicas) {
    const auto [host, port] = parse_host_port(replica, "--replica");
    if (port == 0) throw Error(ErrorCode::kInvalidArgument, "--replica " + replica + ": port 0 cannot be reached");
    addresses_.push_back({host, uint16_t(port)});
  }
}

RouterService::~RouterService() {
  stopping_ = true;
  for (std::thread& t : probes_) t.join();
}

void RouterService::start_probes() {
  for (int r = 0; r < set_.size(); ++r) probes_.emplace_back([this, r] { probe_loop(r); });
}

void RouterService::probe_loop(int replica) {
  const Address& a = addresses_[size_t(replica)];
  while (!stopping_) {
    const auto probed_at = ReplicaSet::Clock::now();
    const int status = probe(a.host, a.port, "/ready", options_.health_interval);
    if (set_.set_up(replica, status == 200, probed_at)) {
      std::fprintf(stderr, "lazykv router: replica %s is %s\n", set_.name(replica).c_str(),
                   status == 200 ? "up"
                   : status == 0 ? "down: no answer to /ready"
                                 : ("down: /ready answered " + std::to_string(status)).c_str());
    }
    for (auto waited = std::chrono::milliseconds(0); waited < options_.health_interval && !stopping_; waited += kProbeTick) {
      std::this_thread::sleep_for(kProbeTick);
    }
  }
}

void RouterService::mark_down(int replica, const std::string& why) {
  if (set_.set_up(replica, false)) {
    std::fprintf(stderr, "lazykv router: replica %s is down: %s\n", set_.name(replica).c_str(), why.c_str());
  }
}

void RouterService::answer_error(http::ResponseWriter& out, int status, const std::string& replica,
                                 const std::string& message) {
  registry_.counter(metrics::kRouterRequests, {replica, std::to_string(status)}).inc();
  http::Headers named;
  if (replica != kNoReplica) named.emplace_back("x-lazykv-replica", replica);
  out.send(status, "application/json", api::status_error_body(status, message), named);
}

void RouterService::handle(const http::Request& request, http::ResponseWriter& out) {
  if (request.path == "/health") {
    out.send(200, "application/json", R"({"status":"ok"})");
  } else if (request.path == "/ready") {
    const bool ready = !draining_ && set_.any_up();
    out.send(ready ? 200 : 503, "application/json", ready ? R"({"status":"ready"})" : R"({"status":"unavailable"})");
  } else if (request.path == "/metrics") {
    out.send(200, metrics::Registry::kContentType, registry_.render());
  } else if (request.path == "/router/replicas") {
    nlohmann::json replicas = nlohmann::json::array();
    for (const ReplicaSet::ReplicaState& s : set_.snapshot()) {
      replicas.push_back({{"replica", s.name}, {"up", s.up}, {"in_flight", s.in_flight},
                          {"outstanding_tokens", s.outstanding_tokens}});
    }
    out.send(200, "application/json", nlohmann::json{{"replicas", replicas}, {"waiting", set_.waiting()}}.dump());
  } else if (draining_) {
    answer_error(out, 503, kNoReplica, "the router is shutting down; retry on another instance");
  } else {
    struct Counted {
      std::atomic<int>& n;
      explicit Counted(std::atomic<int>& count) : n(count) { ++n; }
      ~Counted() { --n; }
    } counted(in_flight_);
    if (takes_a_slot(request)) {
      route_generation(request, out);
    } else {
      route_other(request, out);
    }
  }
}

void RouterService::route_generation(const http::Request& request, http::ResponseWriter& out) {
  RouteRequest route = describe(request, options_.default_max_tokens);
  const auto deadline = ReplicaSet::Clock::now() + options_.queue_timeout;
  for (;;) {
    const ReplicaSet::Acquired acquired = set_.acquire(route, deadline, [&out] { return out.client_gone(); });
    if (!acquired.assignment) {
      if (acquired.failure != AcquireFailure::kCancelled) {
        answer_error(out, 503, kNoReplica, failure_message(acquired.failure, options_.queue_timeout));
      }
      return;
    }
    const int r = acquired.assignment->replica;
    registry_.counter(metrics::kRouterRoutes, {acquired.assignment->matched_blocks > 0 ? "affinity" : "least_loaded"}).inc();
    struct Slot {  // freed however this attempt ends
      ReplicaSet& set;
      int replica;
      int64_t tokens;
      ~Slot() { set.release(replica, tokens); }
    } slot{set_, r, route.tokens};
    if (forward_to(r, request, out) != UpstreamResult::kNotDelivered) return;
    route.excluded.push_back(r);  // it never reached the replica: another one takes it
  }
}

void RouterService::route_other(const http::Request& request, http::ResponseWriter& out) {
  std::vector<int> excluded;
  for (;;) {
    const int r = set_.lightest_up(excluded);
    if (r < 0) {
      answer_error(out, 503, kNoReplica,
                   failure_message(excluded.empty() ? AcquireFailure::kNoReplicaUp : AcquireFailure::kEveryReplicaFailed,
                                   options_.queue_timeout));
      return;
    }
    if (forward_to(r, request, out) != UpstreamResult::kNotDelivered) return;
    excluded.push_back(r);
  }
}

UpstreamResult RouterService::forward_to(int r, const http::Request& request, http::ResponseWriter& out) {
  const std::string& name = set_.name(r);
  const Address& a = addresses_[size_t(r)];
  auto stream_error = [](const std::string& error) {
    return http::sse_event(api::status_error_body(502, error + "; the request was not retried"));
  };
  const UpstreamOutcome outcome =
      forward_request(a.host, a.port, request, out, options_.upstream, {{"x-lazykv-replica", name}}, stream_error);
  // A failed replica is marked down here, before the caller frees its slot,
  // so the freed slot cannot draw a waiting request to it.
  switch (outcome.result) {
    case UpstreamResult::kAnswered:
      registry_.counter(metrics::kRouterRequests, {name, std::to_string(outcome.status)}).inc();
      break;
    case UpstreamResult::kNotDelivered:
      mark_down(r, outcome.error);
      registry_.counter(metrics::kRouterRetries, {name}).inc();
      break;
    case UpstreamResult::kFailedBeforeAnswer:
      mark_down(r, outcome.error);
      answer_error(out, 502, name, "replica " + name + " failed during the request (" + outcome.error +
                                       "); the request was not retried, as it may have run");
      break;
    case UpstreamResult::kFailedMidStream:
      mark_down(r, outcome.error);
      registry_.counter(metrics::kRouterRequests, {name, "502"}).inc();
      break;
    case UpstreamResult::kClientGone:
      registry_.counter(metrics::kRouterRequests, {name, "499"}).inc();  // nginx's "client closed request"
      break;
  }
  return outcome.result;
}

}  // namespace lazykv::router
