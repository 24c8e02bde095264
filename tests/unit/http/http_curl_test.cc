// The HTTP server against a real client: curl.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>

#include "coordinator/http/http_server.h"
#include "coordinator/http/sse.h"
#include "tests/unit/http/http_test_client.h"

namespace lazykv::http {
namespace {

using testing::curl;
using testing::have_curl;

ServerOptions local_options() {
  ServerOptions options;
  options.port = 0;
  return options;
}

#define SKIP_WITHOUT_CURL() \
  if (!have_curl()) GTEST_SKIP() << "no " << testing::kCurl

TEST(HttpCurlTest, GetSeesMethodPathQueryAndHeaders) {
  SKIP_WITHOUT_CURL();
  Server server(local_options(), [](const Request& request, ResponseWriter& writer) {
    const std::string text = request.method + " " + request.path + " " + request.query + " " +
                             std::string(request.header("x-custom-thing")) + " " +
                             std::string(request.header("missing")) + "|";
    writer.send(200, "text/plain", text, {{"X-Reply", "yes"}});
  });
  server.start();
  const auto result = curl(server.port(), "/v1/models?limit=2&x=y", "-i -H 'X-Custom-Thing: Some Value'");
  EXPECT_EQ(result.status, 200);
  EXPECT_NE(result.output.find("GET /v1/models limit=2&x=y Some Value |"), std::string::npos) << result.output;
  const std::string headers = testing::lower(result.output);
  EXPECT_NE(headers.find("x-reply: yes"), std::string::npos) << result.output;
  EXPECT_NE(headers.find("content-type: text/plain"), std::string::npos) << result.output;
}

TEST(HttpCurlTest, PostBodyReachesHandler) {
  SKIP_WITHOUT_CURL();
  Server server(local_options(), [](const Request& request, ResponseWriter& writer) {
    writer.send(201, "application/json",
                "{\"got\":\"" + request.body + "\",\"type\":\"" + std::string(request.header("content-type")) + "\"}");
  });
  server.start();
  const auto result = curl(server.port(), "/v1/completions",
                           "-H 'Content-Type: application/json' --data-binary 'hello world'");
  EXPECT_EQ(result.status, 201);
  EXPECT_EQ(result.output, "{\"got\":\"hello world\",\"type\":\"application/json\"}");
}

TEST(HttpCurlTest, PostWithExpectContinue) {
  SKIP_WITHOUT_CURL();
  Server server(local_options(), [](const Request& request, ResponseWriter& writer) {
    writer.send(200, "text/plain", std::to_string(request.body.size()));
  });
  server.start();
  // 3 MB: curl asks "Expect: 100-continue" for large bodies by itself.
  const auto result = curl(server.port(), "/upload", "--data-binary @-", "head -c 3000000 /dev/zero");
  EXPECT_EQ(result.status, 200);
  EXPECT_EQ(result.output, "3000000");
}

TEST(HttpCurlTest, StreamedChunksAllArrive) {
  SKIP_WITHOUT_CURL();
  Server server(local_options(), [](const Request&, ResponseWriter& writer) {
    if (!writer.start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}})) return;
    for (int i = 0; i < 5; ++i) {
      if (!writer.write_chunk(sse_event("{\"n\":" + std::to_string(i) + "}"))) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    writer.write_chunk(sse_event("[DONE]"));
    writer.end_stream();
  });
  server.start();
  const auto result = curl(server.port(), "/v1/chat/completions", "-N -i");
  EXPECT_EQ(result.status, 200);
  const std::string expected =
      "data: {\"n\":0}\n\ndata: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: {\"n\":3}\n\ndata: {\"n\":4}\n\ndata: [DONE]\n\n";
  const size_t body_start = result.output.find("\r\n\r\n");
  ASSERT_NE(body_start, std::string::npos) << result.output;
  EXPECT_EQ(result.output.substr(body_start + 4), expected);
  EXPECT_NE(testing::lower(result.output).find("transfer-encoding: chunked"), std::string::npos) << result.output;
}

TEST(HttpCurlTest, OversizeBodyGets413WithoutCallingHandler) {
  SKIP_WITHOUT_CURL();
  std::atomic<int> calls{0};
  ServerOptions options = local_options();
  options.max_body_bytes = 100;
  Server server(options, [&](const Request&, ResponseWriter& writer) {
    ++calls;
    writer.send(200, "text/plain", "ok");
  });
  server.start();
  const auto big = curl(server.port(), "/v1/completions", "--data-binary @-", "head -c 1000 /dev/zero | tr '\\0' a");
  EXPECT_EQ(big.status, 413);
  EXPECT_NE(big.output.find("request body exceeds 100 bytes"), std::string::npos) << big.output;
  EXPECT_NE(big.output.find("\"error\""), std::string::npos) << big.output;
  EXPECT_EQ(calls.load(), 0);
  // At the limit is fine, and the server is still up.
  const auto fits = curl(server.port(), "/v1/completions", "--data-binary @-", "head -c 100 /dev/zero | tr '\\0' a");
  EXPECT_EQ(fits.status, 200);
  EXPECT_EQ(fits.output, "ok");
  EXPECT_EQ(calls.load(), 1);
}

TEST(HttpCurlTest, CustomErrorBody) {
  SKIP_WITHOUT_CURL();
  ServerOptions options = local_options();
  options.max_body_bytes = 10;
  options.error_body = [](int status, const std::string& message) {
    return "custom " + std::to_string(status) + " " + message;
  };
  Server server(options, [](const Request&, ResponseWriter& writer) { writer.send(200, "text/plain", "ok"); });
  server.start();
  const auto result = curl(server.port(), "/", "--data-binary 'more than ten bytes'");
  EXPECT_EQ(result.status, 413);
  EXPECT_EQ(result.output, "custom 413 request body exceeds 10 bytes");
}

TEST(HttpCurlTest, HandlerThrowingGives500AndServerGoesOn) {
  SKIP_WITHOUT_CURL();
  Server server(local_options(), [](const Request& request, ResponseWriter& writer) {
    if (request.path == "/throw") throw std::runtime_error("boom");
    writer.send(200, "text/plain", "fine");
  });
  server.start();
  const auto failed = curl(server.port(), "/throw");
  EXPECT_EQ(failed.status, 500);
  EXPECT_NE(failed.output.find("boom"), std::string::npos) << failed.output;
  const auto next = curl(server.port(), "/ok");
  EXPECT_EQ(next.status, 200);
  EXPECT_EQ(next.output, "fine");
}

}  // namespace
}  // namespace lazykv::http
