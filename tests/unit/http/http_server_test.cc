// The HTTP server at the protocol level, with a raw socket client.
#include "coordinator/http/http_server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "common/error.h"
#include "tests/unit/http/http_test_client.h"

namespace lazykv::http {
namespace {

using testing::RawClient;
using testing::RawResponse;
using testing::wait_until;

ServerOptions local_options() {
  ServerOptions options;
  options.port = 0;
  return options;
}

std::string get(const std::string& path, const std::string& extra_headers = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: test\r\n" + extra_headers + "\r\n";
}

// Echoes the path (and, for /remote, the client address).
void echo_handler(const Request& request, ResponseWriter& writer) {
  writer.send(200, "text/plain", request.path == "/remote" ? request.remote : request.path);
}

// Runs server.stop(grace) on another thread and fails (ending the process,
// rather than hanging the test run) if it does not return in a generous time.
void stop_or_die(Server& server, std::chrono::milliseconds grace = std::chrono::milliseconds(0)) {
  auto stopped = std::async(std::launch::async, [&] { server.stop(grace); });
  if (stopped.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::fprintf(stderr, "Server::stop did not return\n");
    std::_Exit(1);
  }
}

TEST(HttpServerTest, EphemeralPortAndListenFailure) {
  Server server(local_options(), echo_handler);
  ASSERT_NE(server.port(), 0);
  ServerOptions same_port = local_options();
  same_port.port = server.port();
  try {
    Server second(same_port, echo_handler);
    FAIL() << "a second listener on the same port must fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find("cannot listen on 127.0.0.1:" + std::to_string(server.port())),
              std::string::npos)
        << e.what();
  }
  ServerOptions bad_host = local_options();
  bad_host.host = "no-such-host.invalid";
  EXPECT_THROW(Server(bad_host, echo_handler), Error);
}

TEST(HttpServerTest, StopWithoutStartAndTwice) {
  Server server(local_options(), echo_handler);
  server.stop();
  server.stop();
  EXPECT_EQ(server.active_connections(), 0);
  EXPECT_THROW(server.start(), Error);
}

TEST(HttpServerTest, MalformedRequestGets400AndClose) {
  Server server(local_options(), echo_handler);
  server.start();
  RawClient client(server.port());
  ASSERT_TRUE(client.connected());
  client.send("this is not http\r\n\r\n");
  const RawResponse response = client.read_response();
  EXPECT_EQ(response.status, 400);
  const auto body = nlohmann::json::parse(response.body);
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_NE(body["error"]["message"].get<std::string>().find("malformed"), std::string::npos) << response.body;
  EXPECT_TRUE(client.read_until_closed());
}

TEST(HttpServerTest, KeepAliveServesTwoRequestsOnOneConnection) {
  Server server(local_options(), echo_handler);
  server.start();
  RawClient client(server.port());
  client.send(get("/remote"));
  const RawResponse first = client.read_response();
  EXPECT_EQ(first.status, 200);
  EXPECT_EQ(first.body.rfind("127.0.0.1:", 0), 0u) << first.body;
  EXPECT_EQ(server.active_connections(), 1);
  client.send(get("/remote"));
  const RawResponse second = client.read_response();
  EXPECT_EQ(second.status, 200);
  EXPECT_EQ(second.body, first.body);  // same client port: same connection
}

TEST(HttpServerTest, PipelinedRequestsAnsweredInOrder) {
  Server server(local_options(), echo_handler);
  server.start();
  RawClient client(server.port());
  client.send(get("/a") + get("/b") + get("/c", "Connection: close\r\n"));
  EXPECT_EQ(client.read_response().body, "/a");
  EXPECT_EQ(client.read_response().body, "/b");
  const RawResponse last = client.read_response();
  EXPECT_EQ(last.body, "/c");
  EXPECT_EQ(testing::lower(last.header("connection")), "close");
  EXPECT_TRUE(client.read_until_closed());
}

TEST(HttpServerTest, Http10WithoutKeepAliveCloses) {
  Server server(local_options(), echo_handler);
  server.start();
  RawClient client(server.port());
  client.send("GET /old HTTP/1.0\r\n\r\n");
  const RawResponse response = client.read_response();
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "/old");
  EXPECT_TRUE(client.read_until_closed());
}

TEST(HttpServerTest, Http10StreamEndsWithClose) {
  Server server(local_options(), [](const Request&, ResponseWriter& writer) {
    writer.start_stream(200, "text/plain");
    writer.write_chunk("one ");
    writer.write_chunk("two");
    writer.end_stream();
  });
  server.start();
  RawClient client(server.port());
  client.send("GET / HTTP/1.0\r\n\r\n");
  const RawResponse response = client.read_response();  // no length, no chunks: read to close
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "one two");
}

TEST(HttpServerTest, RequestFieldsAndLowerCaseHeaders) {
  Request seen;
  Server server(local_options(), [&](const Request& request, ResponseWriter& writer) {
    seen = request;
    writer.send(204, "text/plain", "");
  });
  server.start();
  RawClient client(server.port());
  client.send(
      "POST /v1/x?a=1&b HTTP/1.1\r\nHost: t\r\nX-Mixed-Case: V1\r\nx-mixed-case: v2\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_EQ(client.read_response().status, 204);
  EXPECT_EQ(seen.method, "POST");
  EXPECT_EQ(seen.path, "/v1/x");
  EXPECT_EQ(seen.query, "a=1&b");
  EXPECT_EQ(seen.body, "abc");
  EXPECT_EQ(seen.header("x-mixed-case"), "V1");
  int mixed = 0;
  for (const auto& [name, value] : seen.headers) mixed += name == "x-mixed-case";
  EXPECT_EQ(mixed, 2);
}

TEST(HttpServerTest, HeadAnswerHasNoBody) {
  Server server(local_options(), [](const Request& request, ResponseWriter& writer) {
    if (request.path == "/stream") {
      writer.start_stream(200, "text/plain");
      writer.write_chunk("not for HEAD");
      writer.end_stream();
      return;
    }
    writer.send(200, "text/plain", "twelve bytes");
  });
  server.start();
  RawClient client(server.port());
  client.send("HEAD / HTTP/1.1\r\nHost: t\r\n\r\n");
  const RawResponse head = client.read_response(/*no_body=*/true);
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.header("content-length"), "12");
  client.send("HEAD /stream HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(client.read_response(/*no_body=*/true).status, 200);
  // Nothing of a body came in between: the next answer parses cleanly.
  client.send(get("/"));
  const RawResponse next = client.read_response();
  EXPECT_EQ(next.status, 200);
  EXPECT_EQ(next.body, "twelve bytes");
}

TEST(HttpServerTest, HugeHeaderGets431) {
  Server server(local_options(), echo_handler);
  server.start();
  RawClient client(server.port());
  client.send(get("/", "X-Big: " + std::string(70 * 1024, 'h') + "\r\n"));
  const RawResponse response = client.read_response();
  EXPECT_EQ(response.status, 431);
  EXPECT_TRUE(client.read_until_closed());
}

TEST(HttpServerTest, ExpectContinueIsAnswered) {
  Server server(local_options(), [](const Request& request, ResponseWriter& writer) {
    writer.send(200, "text/plain", request.body);
  });
  server.start();
  RawClient client(server.port());
  client.send("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
  const RawResponse interim = client.read_response();
  EXPECT_EQ(interim.status, 100);
  client.send("hello");
  const RawResponse response = client.read_response();
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "hello");
}

TEST(HttpServerTest, ChunkedBodyOverLimitGets413) {
  std::atomic<int> calls{0};
  ServerOptions options = local_options();
  options.max_body_bytes = 16;
  Server server(options, [&](const Request&, ResponseWriter& writer) {
    ++calls;
    writer.send(200, "text/plain", "ok");
  });
  server.start();
  RawClient client(server.port());
  client.send("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n20\r\n" + std::string(32, 'x') +
              "\r\n0\r\n\r\n");
  const RawResponse response = client.read_response();
  EXPECT_EQ(response.status, 413);
  EXPECT_NE(response.body.find("request body exceeds 16 bytes"), std::string::npos) << response.body;
  EXPECT_TRUE(client.read_until_closed());
  EXPECT_EQ(calls.load(), 0);
}

TEST(HttpServerTest, ChunksReachTheClientBeforeTheStreamEnds) {
  std::atomic<bool> client_saw_first{false};
  std::atomic<bool> seen_before_second{false};
  Server server(local_options(), [&](const Request&, ResponseWriter& writer) {
    writer.start_stream(200, "text/event-stream");
    writer.write_chunk("first-chunk");
    // The client must get the first chunk while the stream is still open.
    seen_before_second = wait_until([&] { return client_saw_first.load(); });
    writer.write_chunk("second-chunk");
    writer.end_stream();
  });
  server.start();
  RawClient client(server.port());
  client.send(get("/stream"));
  ASSERT_TRUE(client.read_until("first-chunk"));
  client_saw_first = true;
  const RawResponse response = client.read_response();
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "first-chunksecond-chunk");
  EXPECT_TRUE(seen_before_second.load());
  // The connection stays usable after a finished stream.
  client.send(get("/stream"));
  client_saw_first = true;
  EXPECT_EQ(client.read_response().body, "first-chunksecond-chunk");
}

TEST(HttpServerTest, ClientDisconnectMidStreamIsSeen) {
  std::atomic<bool> checked_before{false}, gone_before{true}, write_failed{false}, gone_after{false}, done{false};
  Server server(local_options(), [&](const Request&, ResponseWriter& writer) {
    writer.start_stream(200, "text/event-stream");
    writer.write_chunk("hello");
    gone_before = writer.client_gone();
    checked_before = true;
    const std::string filler(1024, 'x');
    write_failed = wait_until([&] { return !writer.write_chunk(filler); });
    gone_after = writer.client_gone();
    EXPECT_FALSE(writer.end_stream());
    done = true;
  });
  server.start();
  {
    RawClient client(server.port());
    client.send(get("/stream"));
    ASSERT_TRUE(client.read_until("hello"));
    ASSERT_TRUE(wait_until([&] { return checked_before.load(); }));
  }  // closes the socket
  ASSERT_TRUE(wait_until([&] { return done.load(); }));
  EXPECT_FALSE(gone_before.load());
  EXPECT_TRUE(write_failed.load());
  EXPECT_TRUE(gone_after.load());
  EXPECT_TRUE(wait_until([&] { return server.active_connections() == 0; }));
}

TEST(HttpServerTest, ClientGoneWhileHandlerWaits) {
  std::atomic<bool> entered{false}, saw_gone{false}, done{false};
  Server server(local_options(), [&](const Request&, ResponseWriter& writer) {
    entered = true;
    saw_gone = wait_until([&] { return writer.client_gone(); });
    writer.send(200, "text/plain", "too late");
    done = true;
  });
  server.start();
  {
    RawClient client(server.port());
    client.send(get("/slow"));
    ASSERT_TRUE(wait_until([&] { return entered.load(); }));
  }
  ASSERT_TRUE(wait_until([&] { return done.load(); }));
  EXPECT_TRUE(saw_gone.load());
}

TEST(HttpServerTest, PipelinedRequestIsNotClientGone) {
  std::atomic<int> gone_seen{0};
  std::atomic<bool> second_sent{false};
  Server server(local_options(), [&](const Request& request, ResponseWriter& writer) {
    if (request.path == "/first") {
      // The next request is already in the socket: the client is still here.
      wait_until([&] { return second_sent.load(); });
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      gone_seen += writer.client_gone();
    }
    writer.send(200, "text/plain", request.path);
  });
  server.start();
  RawClient client(server.port());
  client.send(get("/first"));
  client.send(get("/second"));
  second_sent = true;
  EXPECT_EQ(client.read_response().body, "/first");
  EXPECT_EQ(client.read_response().body, "/second");
  EXPECT_EQ(gone_seen.load(), 0);
}

TEST(HttpServerTest, HandlerErrorsGive500) {
  Server server(local_options(), [](const Request& request, ResponseWriter& writer) {
    if (request.path == "/throw") throw Error(ErrorCode::kInternal, "kaput");
    if (request.path == "/throw-other") throw 42;
    if (request.path == "/silent") return;
    if (request.path == "/throw-mid-stream") {
      writer.start_stream(200, "text/plain");
      writer.write_chunk("partial");
      throw std::runtime_error("stream broke");
    }
    writer.send(200, "text/plain", "fine");
  });
  server.start();
  {
    RawClient client(server.port());
    client.send(get("/throw"));
    const RawResponse thrown = client.read_response();
    EXPECT_EQ(thrown.status, 500);
    EXPECT_NE(thrown.body.find("kaput"), std::string::npos) << thrown.body;
    EXPECT_EQ(nlohmann::json::parse(thrown.body)["error"]["type"], "server_error");
    // The connection survives a 500 that was sent whole.
    client.send(get("/silent"));
    const RawResponse silent = client.read_response();
    EXPECT_EQ(silent.status, 500);
    EXPECT_NE(silent.body.find("handler sent no response"), std::string::npos) << silent.body;
    client.send(get("/throw-other"));
    EXPECT_EQ(client.read_response().status, 500);
  }
  {
    RawClient client(server.port());
    client.send(get("/throw-mid-stream"));
    EXPECT_TRUE(client.read_until_closed());
    EXPECT_NE(client.buffer().find("partial"), std::string::npos);
    EXPECT_EQ(client.buffer().find("0\r\n\r\n"), std::string::npos);  // never properly ended
  }
  RawClient next(server.port());
  next.send(get("/ok"));
  const RawResponse ok = next.read_response();
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body, "fine");
}

TEST(HttpServerTest, MaxConnectionsTurnsAwayExtraClients) {
  ServerOptions options = local_options();
  options.max_connections = 1;
  Server server(options, echo_handler);
  server.start();
  auto first = std::make_unique<RawClient>(server.port());
  first->send(get("/first"));
  EXPECT_EQ(first->read_response().status, 200);
  EXPECT_EQ(server.active_connections(), 1);
  {
    RawClient extra(server.port());
    extra.send(get("/extra"));
    const RawResponse rejected = extra.read_response();
    EXPECT_EQ(rejected.status, 503);
    EXPECT_NE(rejected.body.find("too many connections"), std::string::npos) << rejected.body;
    EXPECT_EQ(rejected.header("retry-after"), "1");
    EXPECT_TRUE(extra.read_until_closed());
  }
  first.reset();
  ASSERT_TRUE(wait_until([&] { return server.active_connections() == 0; }));
  RawClient later(server.port());
  later.send(get("/later"));
  EXPECT_EQ(later.read_response().body, "/later");
}

TEST(HttpServerTest, IdleConnectionIsClosedAfterTimeout) {
  ServerOptions options = local_options();
  options.keep_alive_timeout = std::chrono::seconds(1);
  Server server(options, echo_handler);
  server.start();
  RawClient client(server.port());
  client.send(get("/a"));
  EXPECT_EQ(client.read_response().status, 200);
  EXPECT_TRUE(client.read_until_closed());  // EOF, not the client's 10 s timeout
  EXPECT_TRUE(wait_until([&] { return server.active_connections() == 0; }));
}

TEST(HttpServerTest, StopEndsIdleKeepAliveConnection) {
  Server server(local_options(), echo_handler);  // keep-alive timeout 60 s
  server.start();
  RawClient client(server.port());
  client.send(get("/a"));
  EXPECT_EQ(client.read_response().status, 200);
  stop_or_die(server);
  EXPECT_TRUE(client.read_until_closed());
  EXPECT_EQ(server.active_connections(), 0);
  RawClient refused(server.port());
  EXPECT_FALSE(refused.connected());
  stop_or_die(server);  // twice is fine
}

TEST(HttpServerTest, StopWaitsForRunningRequestWithinGrace) {
  std::atomic<bool> entered{false}, release{false};
  Server server(local_options(), [&](const Request&, ResponseWriter& writer) {
    entered = true;
    wait_until([&] { return release.load(); });
    writer.send(200, "text/plain", "finished");
  });
  server.start();
  RawClient busy(server.port());
  busy.send(get("/work"));
  ASSERT_TRUE(wait_until([&] { return entered.load(); }));
  RawClient idle(server.port());
  ASSERT_TRUE(idle.connected());
  // Accepted, not just queued in the listen backlog (those get a reset).
  ASSERT_TRUE(wait_until([&] { return server.active_connections() == 2; }));
  auto stopped = std::async(std::launch::async, [&] { server.stop(std::chrono::seconds(60)); });
  // The idle connection is closed at once; the busy one is waited for.
  EXPECT_TRUE(idle.read_until_closed());
  EXPECT_EQ(stopped.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  release = true;
  ASSERT_EQ(stopped.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  const RawResponse response = busy.read_response();
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "finished");
  EXPECT_EQ(testing::lower(response.header("connection")), "close");  // no keep-alive while stopping
  EXPECT_TRUE(busy.read_until_closed());
}

TEST(HttpServerTest, StopAfterGraceCutsOffStreamingHandler) {
  std::atomic<bool> streaming{false}, handler_saw_failure{false};
  Server server(local_options(), [&](const Request&, ResponseWriter& writer) {
    writer.start_stream(200, "text/plain");
    streaming = true;
    // Streams until the server cuts the connection.
    handler_saw_failure = wait_until([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return !writer.write_chunk("tick ") || writer.client_gone();
    });
  });
  server.start();
  RawClient client(server.port());
  client.send(get("/forever"));
  ASSERT_TRUE(wait_until([&] { return streaming.load(); }));
  stop_or_die(server, std::chrono::milliseconds(50));
  EXPECT_TRUE(handler_saw_failure.load());
  EXPECT_EQ(server.active_connections(), 0);
}

TEST(HttpServerTest, StopAcceptingKeepsRunningConnections) {
  Server server(local_options(), echo_handler);
  server.start();
  RawClient client(server.port());
  client.send(get("/a"));
  EXPECT_EQ(client.read_response().body, "/a");
  server.stop_accepting();
  RawClient refused(server.port());
  EXPECT_FALSE(refused.connected());
  client.send(get("/b"));
  EXPECT_EQ(client.read_response().body, "/b");
}

TEST(HttpServerTest, ManyClientsAtOnce) {
  Server server(local_options(), echo_handler);
  server.start();
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] {
      RawClient client(server.port());
      for (int j = 0; j < 5; ++j) {
        const std::string path = "/c" + std::to_string(i) + "/" + std::to_string(j);
        client.send(get(path));
        ok += client.read_response().body == path;
      }
    });
  }
  for (auto& thread : clients) thread.join();
  EXPECT_EQ(ok.load(), 80);
}

}  // namespace
}  // namespace lazykv::http
