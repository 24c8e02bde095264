// The router between a client and real HTTP servers (lazykv's own, with a
// test handler) or a scripted replica that answers with exact bytes, for the
// failure cases no well-behaved server produces.
#include "coordinator/router/router_service.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/metrics/metric_names.h"
#include "tests/unit/http/http_test_client.h"

namespace lazykv::router {
namespace {

using namespace std::chrono_literals;
using http::testing::RawClient;
using http::testing::wait_until;

// A replica that reads one request per connection (header and
// Content-Length body), remembers it, writes `answer` and closes.
class ScriptedReplica {
 public:
  explicit ScriptedReplica(std::string answer) : answer_(std::move(answer)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address);
    ::listen(fd_, 16);
    socklen_t size = sizeof address;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &size);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~ScriptedReplica() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  uint16_t port() const { return port_; }
  int requests() const { return requests_.load(); }

 private:
  void serve() {
    for (;;) {
      const int client = ::accept(fd_, nullptr, nullptr);
      if (client < 0) return;
      std::string request;
      char buffer[4096];
      size_t needed = std::string::npos;
      while (needed == std::string::npos || request.size() < needed) {
        const ssize_t n = ::recv(client, buffer, sizeof buffer, 0);
        if (n <= 0) break;
        request.append(buffer, size_t(n));
        const size_t end = request.find("\r\n\r\n");
        if (needed == std::string::npos && end != std::string::npos) {
          const size_t at = request.find("Content-Length: ");
          needed = end + 4 + (at == std::string::npos || at > end ? 0 : std::stoul(request.substr(at + 16)));
        }
      }
      ++requests_;
      ::send(client, answer_.data(), answer_.size(), MSG_NOSIGNAL);
      ::close(client);
    }
  }

  std::string answer_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<int> requests_{0};
  std::thread thread_;
};

http::ServerOptions local_server() {
  http::ServerOptions options;
  options.port = 0;
  return options;
}

// A router over the given replica ports, each marked up (no probes run).
struct Router {
  explicit Router(const std::vector<uint16_t>& ports) {
    RouterOptions options;
    for (uint16_t port : ports) options.replicas.push_back("127.0.0.1:" + std::to_string(port));
    service = std::make_unique<RouterService>(options, registry);
    for (int r = 0; r < int(ports.size()); ++r) service->replicas().set_up(r, true);
    server = std::make_unique<http::Server>(
        local_server(), [this](const http::Request& q, http::ResponseWriter& w) { service->handle(q, w); });
    server->start();
  }
  std::string name(int r) { return service->replicas().name(r); }
  bool up(int r) { return service->replicas().snapshot()[size_t(r)].up; }
  double counter(const metrics::MetricDef& def, const metrics::LabelValues& labels) {
    return registry.counter(def, labels).value();
  }
  metrics::Registry registry;
  std::unique_ptr<RouterService> service;
  std::unique_ptr<http::Server> server;
};

std::string post(const std::string& path, const std::string& body, const std::string& extra_headers = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n" + extra_headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

const std::string kBody = R"({"model": "m", "prompt": "Hello", "max_tokens": 4})";

TEST(RouterService, RelaysAWholeAnswerWithItsHeadersAndNamesTheReplica) {
  std::string seen_authorization;
  http::Server replica(local_server(), [&](const http::Request& q, http::ResponseWriter& w) {
    seen_authorization = std::string(q.header("authorization"));
    w.send(201, "application/json", R"({"ok": true})", {{"x-request-id", "abc"}});
  });
  replica.start();
  Router router({replica.port()});
  RawClient client(router.server->port());
  client.send(post("/v1/completions", kBody, "Authorization: Bearer k\r\n"));
  const auto answer = client.read_response();
  EXPECT_EQ(answer.status, 201);
  EXPECT_EQ(answer.body, R"({"ok": true})");
  EXPECT_EQ(answer.header("content-type"), "application/json");
  EXPECT_EQ(answer.header("x-request-id"), "abc");
  EXPECT_EQ(answer.header("x-lazykv-replica"), router.name(0));
  EXPECT_EQ(seen_authorization, "Bearer k");
  // Counted once the relay returns, just after the client has the answer.
  EXPECT_TRUE(wait_until([&] { return router.counter(metrics::kRouterRequests, {router.name(0), "201"}) == 1; }));
}

TEST(RouterService, RelaysAStreamAsItArrives) {
  std::promise<void> first_seen;
  http::Server replica(local_server(), [&](const http::Request&, http::ResponseWriter& w) {
    w.start_stream(200, "text/event-stream");
    w.write_chunk("data: 1\n\n");
    first_seen.get_future().wait_for(20s);  // the second event only once the client has the first
    w.write_chunk("data: 2\n\n");
    w.end_stream();
  });
  replica.start();
  Router router({replica.port()});
  RawClient client(router.server->port());
  client.send(post("/v1/completions", kBody));
  ASSERT_TRUE(client.read_until("data: 1\n\n"));  // a router holding the stream would time out here
  first_seen.set_value();
  ASSERT_TRUE(client.read_until("data: 2\n\n"));
  ASSERT_TRUE(client.read_until("0\r\n\r\n"));  // the chunked stream ends
}

TEST(RouterService, AnAnswerToHeadIsRelayedNotTakenForABrokenOne) {
  ScriptedReplica replica("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\n");
  Router router({replica.port()});
  RawClient client(router.server->port());
  client.send("HEAD /v1/models HTTP/1.1\r\nHost: router\r\n\r\n");
  EXPECT_EQ(client.read_response(/*no_body=*/true).status, 200);
  EXPECT_TRUE(router.up(0));
}

TEST(RouterService, AStreamThatBreaksEndsWithAnErrorEventOfItsOwn) {
  ScriptedReplica replica(
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
      "a\r\ndata: {\"a\"\r\n");  // half an event, then the connection closes
  Router router({replica.port()});
  RawClient client(router.server->port());
  client.send(post("/v1/completions", kBody));
  const auto answer = client.read_response();
  EXPECT_EQ(answer.status, 200);
  EXPECT_EQ(answer.body.rfind("data: {\"a\"\n\ndata: {\"error\"", 0), 0u) << answer.body;
  EXPECT_NE(answer.body.find("the request was not retried"), std::string::npos) << answer.body;
  EXPECT_TRUE(wait_until([&] { return !router.up(0); }));
}

TEST(RouterService, ARequestAReplicaNeverTookGoesToAnother) {
  uint16_t closed_port = 0;
  {
    ScriptedReplica gone("");
    closed_port = gone.port();
  }  // nothing listens there now
  http::Server replica(local_server(), [](const http::Request&, http::ResponseWriter& w) {
    w.send(200, "application/json", "{}");
  });
  replica.start();
  Router router({closed_port, replica.port()});
  for (int i = 0; i < 2; ++i) {  // ties go round the replicas: one of these tries the closed port first
    RawClient client(router.server->port());
    client.send(post("/v1/completions", kBody));
    const auto answer = client.read_response();
    EXPECT_EQ(answer.status, 200);
    EXPECT_EQ(answer.header("x-lazykv-replica"), router.name(1));
  }
  EXPECT_EQ(router.counter(metrics::kRouterRetries, {router.name(0)}), 1);  // counted before the retry
  EXPECT_FALSE(router.up(0));
}

TEST(RouterService, AReplicaThatFailsAfterTakingARequestGivesA502NamingItAndNoRetry) {
  ScriptedReplica broken("");  // reads the request, closes without a word
  std::atomic<int> other_requests{0};
  http::Server other(local_server(), [&](const http::Request&, http::ResponseWriter& w) {
    ++other_requests;
    w.send(200, "application/json", "{}");
  });
  other.start();
  Router router({broken.port(), other.port()});
  RawClient client(router.server->port());
  client.send(post("/v1/completions", kBody));
  const auto answer = client.read_response();
  EXPECT_EQ(answer.status, 502);
  EXPECT_NE(answer.body.find("failed during the request"), std::string::npos) << answer.body;
  EXPECT_EQ(answer.header("x-lazykv-replica"), router.name(0));
  EXPECT_EQ(broken.requests(), 1);
  EXPECT_EQ(other_requests.load(), 0);
  EXPECT_TRUE(wait_until([&] { return !router.up(0); }));
}

TEST(RouterService, WithNoReplicaUpRequestsGet503AtOnce) {
  Router router({1});  // port 1: marked down below, never tried
  router.service->replicas().set_up(0, false);
  RawClient client(router.server->port());
  client.send(post("/v1/completions", kBody));
  const auto answer = client.read_response();
  EXPECT_EQ(answer.status, 503);
  EXPECT_NE(answer.body.find("no replica is up"), std::string::npos);
  RawClient models(router.server->port());
  models.send("GET /v1/models HTTP/1.1\r\nHost: router\r\n\r\n");
  EXPECT_EQ(models.read_response().status, 503);
}

}  // namespace
}  // namespace lazykv::router
