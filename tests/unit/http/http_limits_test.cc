// The HTTP server's limits against clients that try to hold it: deadlines
// for the header, the body (a minimum rate) and idle keep-alive, the caps on
// connections (whole and per client address) with probe slots past them,
// the header check that refuses before a body is read, the memory budget for
// bodies, and idle connections that cost no threads.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "coordinator/http/http_server.h"
#include "tests/unit/http/http_test_client.h"

namespace lazykv::http {
namespace {

using testing::RawClient;
using testing::RawResponse;
using testing::wait_until;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

ServerOptions local_options() {
  ServerOptions options;
  options.port = 0;
  return options;
}

void echo_handler(const Request& request, ResponseWriter& writer) {
  writer.send(200, "text/plain", request.path + (request.body.empty() ? "" : ":" + request.body));
}

// Counts the statuses of the server's own answers.
struct OwnAnswers {
  std::mutex mutex;
  std::vector<int> statuses;
  void attach(ServerOptions& options) {
    options.on_own_answer = [this](int status) {
      std::lock_guard lock(mutex);
      statuses.push_back(status);
    };
  }
  int count(int status) {
    std::lock_guard lock(mutex);
    return int(std::count(statuses.begin(), statuses.end(), status));
  }
};

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

TEST(HttpLimitsTest, HeaderSentByteByByteIsCutAtTheHeaderDeadline) {
  ServerOptions options = local_options();
  options.header_timeout = milliseconds(800);
  OwnAnswers own;
  own.attach(options);
  Server server(options, echo_handler);
  server.start();
  RawClient client(server.port());
  const auto start = Clock::now();
  // One byte every 100 ms: each read is quick, the header never ends.
  std::atomic<bool> stop_sending{false};
  std::thread slow([&] {
    const std::string header = "GET / HTTP/1.1\r\nHost: t\r\nX-Slow: " + std::string(200, 'a');
    for (size_t i = 0; i < header.size() && !stop_sending; ++i) {
      try {
        client.send(header.substr(i, 1));
      } catch (const std::exception&) {
        return;  // the server closed
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
  });
  const RawResponse response = client.read_response();
  stop_sending = true;
  slow.join();
  EXPECT_EQ(response.status, 408);
  EXPECT_NE(response.body.find("did not arrive within 0.8 s"), std::string::npos) << response.body;
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_EQ(own.count(408), 1);
  client.close();
  EXPECT_TRUE(wait_until([&] { return server.active_connections() == 0; }));
}

TEST(HttpLimitsTest, SilentNewConnectionIsClosedAtTheHeaderDeadline) {
  ServerOptions options = local_options();
  options.header_timeout = milliseconds(500);
  Server server(options, echo_handler);
  server.start();
  RawClient client(server.port());
  const auto start = Clock::now();
  EXPECT_TRUE(client.read_until_closed());  // no request: closed without an answer
  EXPECT_EQ(client.buffer(), "");
  EXPECT_LT(seconds_since(start), 5.0);
}

TEST(HttpLimitsTest, BodyBelowTheMinimumRateIsCut) {
  ServerOptions options = local_options();
  options.body_timeout = milliseconds(600);
  options.min_body_rate = 1000;  // after 0.6 s, 1000 bytes a second
  std::atomic<int> calls{0};
  Server server(options, [&](const Request& request, ResponseWriter& writer) {
    ++calls;
    echo_handler(request, writer);
  });
  server.start();
  RawClient client(server.port());
  client.send("POST /slow HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n");
  std::atomic<bool> stop_sending{false};
  std::thread slow([&] {
    for (int i = 0; i < 1000 && !stop_sending; ++i) {
      try {
        client.send("x");
      } catch (const std::exception&) {
        return;
      }
      std::this_thread::sleep_for(milliseconds(50));  // 20 bytes a second
    }
  });
  const auto start = Clock::now();
  const RawResponse response = client.read_response();
  stop_sending = true;
  slow.join();
  EXPECT_EQ(response.status, 408);
  EXPECT_NE(response.body.find("arrived too slowly"), std::string::npos) << response.body;
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_EQ(calls.load(), 0);
}

TEST(HttpLimitsTest, BodyAtTheRateMayTakeLongerThanTheTimeout) {
  ServerOptions options = local_options();
  options.body_timeout = milliseconds(300);
  options.min_body_rate = 1000;
  Server server(options, echo_handler);
  server.start();
  RawClient client(server.port());
  client.send("POST /steady HTTP/1.1\r\nHost: t\r\nContent-Length: 1200\r\n\r\n");
  // 100 bytes every 50 ms (2000 bytes a second) for 0.6 s: twice the timeout.
  for (int i = 0; i < 12; ++i) {
    client.send(std::string(100, 'a' + char(i)));
    std::this_thread::sleep_for(milliseconds(50));
  }
  const RawResponse response = client.read_response();
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body.size(), std::string("/steady:").size() + 1200);
}

TEST(HttpLimitsTest, PerAddressCapLeavesOtherAddressesServed) {
  ServerOptions options = local_options();
  options.max_connections_per_address = 2;
  options.probe_slots = 0;
  OwnAnswers own;
  own.attach(options);
  Server server(options, echo_handler);
  server.start();
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 2; ++i) {
    held.push_back(std::make_unique<RawClient>(server.port(), "127.0.0.1"));
    held.back()->send("GET /held HTTP/1.1\r\nHost: t\r\n\r\n");
    EXPECT_EQ(held.back()->read_response().status, 200);
  }
  RawClient third(server.port(), "127.0.0.1");
  third.send("GET /third HTTP/1.1\r\nHost: t\r\n\r\n");
  const RawResponse refused = third.read_response();
  EXPECT_EQ(refused.status, 503);
  EXPECT_NE(refused.body.find("too many connections"), std::string::npos) << refused.body;
  EXPECT_EQ(refused.header("retry-after"), "1");
  RawClient other(server.port(), "127.0.0.2");
  other.send("GET /other HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(other.read_response().body, "/other");
  EXPECT_EQ(own.count(503), 1);
}

TEST(HttpLimitsTest, ProbesAreAnsweredWhileConnectionsAndHandlersAreFull) {
  ServerOptions options = local_options();
  options.max_connections = 1;
  options.handler_threads = 1;
  std::atomic<bool> entered{false}, release{false};
  Server server(options, [&](const Request& request, ResponseWriter& writer) {
    if (request.path == "/health") return (void)writer.send(200, "application/json", R"({"status":"ok"})");
    entered = true;
    wait_until([&] { return release.load(); });
    writer.send(200, "text/plain", "done");
  });
  server.start();
  RawClient busy(server.port());
  busy.send("GET /work HTTP/1.1\r\nHost: t\r\n\r\n");
  ASSERT_TRUE(wait_until([&] { return entered.load(); }));
  // Past the connection cap, the only handler thread taken: a probe on a
  // slot of its own is answered, and the connection then closes.
  RawClient probe(server.port());
  probe.send("GET /health HTTP/1.1\r\nHost: t\r\n\r\n");
  const RawResponse health = probe.read_response();
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, R"({"status":"ok"})");
  EXPECT_EQ(testing::lower(health.header("connection")), "close");
  EXPECT_TRUE(probe.read_until_closed());
  // Anything else on a probe slot is turned away.
  RawClient other(server.port());
  other.send("GET /work HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(other.read_response().status, 503);
  release = true;
  EXPECT_EQ(busy.read_response().body, "done");
}

TEST(HttpLimitsTest, HeaderCheckAnswersBeforeAnyBodyByte) {
  ServerOptions options = local_options();
  std::atomic<int> calls{0};
  options.check_header = [](const Request& head) -> std::optional<EarlyAnswer> {
    EXPECT_TRUE(head.body.empty());
    if (head.header("authorization") == "Bearer good") return std::nullopt;
    EarlyAnswer answer;
    answer.status = 401;
    answer.body = R"({"error":{"message":"bad key"}})";
    answer.headers = {{"WWW-Authenticate", "Bearer"}};
    return answer;
  };
  Server server(options, [&](const Request& request, ResponseWriter& writer) {
    ++calls;
    echo_handler(request, writer);
  });
  server.start();
  // Announces 4 MB and sends none of it: the answer comes anyway.
  RawClient refused(server.port());
  refused.send("POST /v1/x HTTP/1.1\r\nHost: t\r\nContent-Length: 4000000\r\n\r\n");
  const RawResponse answer = refused.read_response();
  EXPECT_EQ(answer.status, 401);
  EXPECT_EQ(answer.header("www-authenticate"), "Bearer");
  EXPECT_EQ(testing::lower(answer.header("connection")), "close");
  EXPECT_TRUE(refused.read_until_closed());
  RawClient accepted(server.port());
  accepted.send("POST /v1/x HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer good\r\nContent-Length: 2\r\n\r\nok");
  EXPECT_EQ(accepted.read_response().body, "/v1/x:ok");
  EXPECT_EQ(calls.load(), 1);
}

TEST(HttpLimitsTest, BodyMemoryBudgetRefusesBodiesPastIt) {
  ServerOptions options = local_options();
  options.max_body_bytes = 1000;
  options.max_body_memory = 1500;
  Server server(options, echo_handler);
  server.start();
  RawClient first(server.port());
  first.send("POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n" + std::string(10, 'a'));
  ASSERT_TRUE(wait_until([&] { return server.body_memory_in_use() == 1000; }));  // its header read
  RawClient second(server.port());
  second.send("POST /b HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n");
  const RawResponse refused = second.read_response();
  EXPECT_EQ(refused.status, 503);
  EXPECT_NE(refused.body.find("too many request bodies"), std::string::npos) << refused.body;
  first.send(std::string(990, 'a'));
  EXPECT_EQ(first.read_response().status, 200);
  EXPECT_TRUE(wait_until([&] { return server.body_memory_in_use() == 0; }));
  // The first body's memory is back: a body of the same size passes.
  RawClient third(server.port());
  third.send("POST /c HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n" + std::string(1000, 'c'));
  EXPECT_EQ(third.read_response().status, 200);
}

TEST(HttpLimitsTest, EveryOwnAnswerIsReported) {
  ServerOptions options = local_options();
  options.max_body_bytes = 8;
  options.max_connections = 1;
  options.probe_slots = 0;
  OwnAnswers own;
  own.attach(options);
  Server server(options, echo_handler);
  server.start();
  const auto answer = [&](const std::string& request) {
    RawClient client(server.port());
    client.send(request);
    const int status = client.read_response().status;
    client.close();  // ends the server's linger
    wait_until([&] { return server.active_connections() == 0; });
    return status;
  };
  EXPECT_EQ(answer("nonsense\r\n\r\n"), 400);
  EXPECT_EQ(answer("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 9\r\n\r\n123456789"), 413);
  EXPECT_EQ(answer("GET / HTTP/1.1\r\nX: " + std::string(70 * 1024, 'h') + "\r\n\r\n"), 431);
  RawClient holder(server.port());
  holder.send("GET /hold HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(holder.read_response().status, 200);
  RawClient extra(server.port());
  extra.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(extra.read_response().status, 503);
  EXPECT_EQ(own.count(400), 1);
  EXPECT_EQ(own.count(413), 1);
  EXPECT_EQ(own.count(431), 1);
  EXPECT_EQ(own.count(503), 1);
}

int thread_count() {
  int count = 0;
  if (DIR* tasks = ::opendir("/proc/self/task")) {
    while (const dirent* entry = ::readdir(tasks)) count += entry->d_name[0] != '.';
    ::closedir(tasks);
  }
  return count;
}

TEST(HttpLimitsTest, ThousandIdleConnectionsCostNoThreads) {
  constexpr int kClients = 1000;
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  if (files.rlim_cur < 2 * kClients + 100) {
    files.rlim_cur = std::min<rlim_t>(files.rlim_max, 2 * kClients + 100);
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  if (files.rlim_cur < 2 * kClients + 100) GTEST_SKIP() << "the file descriptor limit is " << files.rlim_cur;
  ServerOptions options = local_options();
  options.max_connections_per_address = 0;
  Server server(options, echo_handler);
  server.start();
  {  // one request first, so that a handler thread exists before counting
    RawClient warm(server.port());
    warm.send("GET /warm HTTP/1.1\r\nHost: t\r\n\r\n");
    ASSERT_EQ(warm.read_response().status, 200);
  }
  const int threads_before = thread_count();
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < kClients; ++i) {
    idle.push_back(std::make_unique<RawClient>(server.port()));
    ASSERT_TRUE(idle.back()->connected());
  }
  ASSERT_TRUE(wait_until([&] { return server.active_connections() == kClients; }));
  EXPECT_EQ(thread_count(), threads_before);
  // The server still answers at once.
  RawClient client(server.port());
  client.send("GET /still HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(client.read_response().body, "/still");
}

TEST(HttpLimitsTest, StopWhileClientsHammerProbesAndHandlers) {
  // Keep-alive clients, probes answered on the I/O threads and requests on
  // handler threads, cut off by stop() mid-flight, many times over.
  for (int round = 0; round < 10; ++round) {
    ServerOptions options = local_options();
    options.max_connections_per_address = 0;
    Server server(options, [](const Request& request, ResponseWriter& writer) {
      if (request.path == "/health") return (void)writer.send(200, "text/plain", "ok");
      writer.start_stream(200, "text/plain");
      for (int i = 0; i < 5 && writer.write_chunk("tick "); ++i) std::this_thread::sleep_for(milliseconds(1));
      writer.end_stream();
    });
    server.start();
    std::atomic<bool> stop{false};
    std::vector<std::thread> clients;
    for (int c = 0; c < 16; ++c) {
      clients.emplace_back([&, c] {
        while (!stop) {
          try {
            RawClient client(server.port());
            if (!client.connected()) continue;
            for (int k = 0; k < 20 && !stop; ++k) {
              client.send(c % 2 ? "GET /health HTTP/1.1\r\nHost: t\r\n\r\n" : "GET /work HTTP/1.1\r\nHost: t\r\n\r\n");
              client.read_response();
            }
          } catch (const std::exception&) {
            // cut off by stop(): expected
          }
        }
      });
    }
    std::this_thread::sleep_for(milliseconds(30 + 10 * round));
    server.stop(milliseconds(round % 3 == 0 ? 0 : 20));
    stop = true;
    for (std::thread& thread : clients) thread.join();
    EXPECT_EQ(server.active_connections(), 0);
  }
}

TEST(HttpLimitsTest, BadOptionsAreRefused) {
  const auto refused = [](auto change) {
    ServerOptions options = local_options();
    change(options);
    EXPECT_THROW(Server(options, echo_handler), Error);
  };
  refused([](ServerOptions& o) { o.max_connections = 0; });
  refused([](ServerOptions& o) { o.io_threads = 0; });
  refused([](ServerOptions& o) { o.handler_threads = 0; });
  refused([](ServerOptions& o) { o.max_body_memory = o.max_body_bytes - 1; });
  refused([](ServerOptions& o) { o.header_timeout = milliseconds(0); });
}

}  // namespace
}  // namespace lazykv::http
