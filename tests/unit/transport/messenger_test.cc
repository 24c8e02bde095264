// Round trips, concurrency and failure paths of the UCX messenger, over tcp
// and over shared memory (shm + tcp for the connection manager), with shm
// named as a class ("shm") and as transports ("posix,sysv,cma,tcp").
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>

#include "common/error.h"
#include "common/metrics/registry.h"
#include "tests/unit/transport/test_support.h"

namespace lazykv::transport::testing {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kCallTimeout{10000};

TransportOptions options_for(const std::string& transports) {
  TransportOptions options;
  options.transports = transports;
  options.peer_timeout = milliseconds(1000);
  return options;
}

std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

class MessengerTest : public ::testing::TestWithParam<std::string> {
 protected:
  TransportOptions options() const { return options_for(GetParam()); }
  // Every peer of these tests runs on this host, so the configurations that
  // enable shared memory must end up on it.
  std::string expected_transport() const { return GetParam() == "tcp" ? "tcp" : "shm"; }
};

// A reply sink writing into `buffer`, resized to the payload.
auto sink_into(std::vector<uint8_t>& buffer) {
  return [&buffer](std::span<const uint8_t>, size_t bytes) {
    buffer.assign(bytes, 0);
    return std::span<uint8_t>(buffer);
  };
}

TEST_P(MessengerTest, HeaderOnlyRoundTrip) {
  EchoServer echo(options());
  Client client(options(), "127.0.0.1", echo.port());
  EXPECT_TRUE(client.connected());
  std::vector<uint8_t> received;
  const Reply reply = client.call(kOpEcho, bytes_of("hello kv"), {}, sink_into(received), kCallTimeout);
  EXPECT_EQ(reply.status, kStatusOk);
  EXPECT_EQ(std::string(reply.header.begin(), reply.header.end()), "hello kv");
  EXPECT_EQ(reply.payload_bytes, 0u);
  EXPECT_TRUE(received.empty());
}

TEST_P(MessengerTest, PayloadRoundTripsKeepEveryByte) {
  EchoServer echo(options());
  Client client(options(), "127.0.0.1", echo.port());
  uint32_t seed = 1;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4096}, size_t{65536}, size_t{4} << 20}) {
    const auto payload = pattern(bytes, seed++);
    std::vector<uint8_t> received;
    const Reply reply = client.call(kOpEcho, bytes_of("blk"), payload, sink_into(received), kCallTimeout);
    EXPECT_EQ(reply.status, kStatusOk) << bytes;
    EXPECT_EQ(reply.payload_bytes, bytes);
    EXPECT_EQ(received, payload) << "payload of " << bytes << " bytes differs";
  }
}

TEST_P(MessengerTest, RegisteredMemoryOnBothEnds) {
  EchoServer echo(options());
  std::vector<uint8_t> arena(1 << 20);
  echo.server().register_memory(arena);
  Client client(options(), "127.0.0.1", echo.port());
  std::vector<uint8_t> staging(2 << 20);
  client.register_memory(staging);
  const auto payload = pattern(1 << 20, 77);
  std::copy(payload.begin(), payload.end(), staging.begin());
  const Reply reply = client.call(
      kOpEcho, {}, std::span<const uint8_t>(staging).first(payload.size()),
      [&](std::span<const uint8_t>, size_t bytes) { return std::span<uint8_t>(staging).subspan(1 << 20, bytes); },
      kCallTimeout);
  EXPECT_EQ(reply.payload_bytes, payload.size());
  EXPECT_TRUE(std::equal(payload.begin(), payload.end(), staging.begin() + (1 << 20)));
}

TEST_P(MessengerTest, DiscardsAReplyPayloadWhenTheSinkIsEmpty) {
  EchoServer echo(options());
  Client client(options(), "127.0.0.1", echo.port());
  const auto payload = pattern(65536, 3);
  const Reply reply = client.call(
      kOpEcho, {}, payload, [](std::span<const uint8_t>, size_t) { return std::span<uint8_t>(); }, kCallTimeout);
  EXPECT_EQ(reply.status, kStatusOk);
  EXPECT_EQ(reply.payload_bytes, 0u);
  // The endpoint still works after a dropped rendezvous.
  std::vector<uint8_t> received;
  EXPECT_EQ(client.call(kOpEcho, {}, payload, sink_into(received), kCallTimeout).payload_bytes, payload.size());
  EXPECT_EQ(received, payload);
}

TEST_P(MessengerTest, ConcurrentCallsFromEightThreads) {
  EchoServer echo(options());
  Client client(options(), "127.0.0.1", echo.port());
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t i = 0; i < 20; ++i) {
        const auto payload = pattern(4096 * (1 + (i % 5)), t * 100 + i);
        const std::string header = std::to_string(t) + "/" + std::to_string(i);
        std::vector<uint8_t> received;
        const uint32_t op = i % 2 == 0 ? kOpEcho : kOpEchoThread;
        const Reply reply = client.call(op, bytes_of(header), payload, sink_into(received), kCallTimeout);
        if (reply.status == kStatusOk && std::string(reply.header.begin(), reply.header.end()) == header &&
            received == payload) {
          good.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), 8 * 20);
}

TEST_P(MessengerTest, ReplyFromAnotherThread) {
  EchoServer echo(options());
  Client client(options(), "127.0.0.1", echo.port());
  const auto payload = pattern(100000, 9);
  std::vector<uint8_t> received;
  const Reply reply = client.call(kOpEchoThread, bytes_of("x"), payload, sink_into(received), kCallTimeout);
  EXPECT_EQ(reply.status, kStatusOk);
  EXPECT_EQ(received, payload);
}

TEST_P(MessengerTest, RefusedPayload) {
  EchoServer echo(options());
  Client client(options(), "127.0.0.1", echo.port());
  const auto payload = pattern(65536, 5);
  std::vector<uint8_t> received;
  EXPECT_EQ(client.call(kOpRefuse, {}, payload, sink_into(received), kCallTimeout).status, kStatusPayloadRefused);
  // Still usable afterwards.
  EXPECT_EQ(client.call(kOpEcho, {}, payload, sink_into(received), kCallTimeout).status, kStatusOk);
  EXPECT_EQ(received, payload);
}

TEST_P(MessengerTest, HandlerThatNeverRepliesAnswersInternal) {
  EchoServer echo(options());
  Client client(options(), "127.0.0.1", echo.port());
  std::vector<uint8_t> received;
  EXPECT_EQ(client.call(kOpDrop, {}, pattern(10, 1), sink_into(received), kCallTimeout).status, kStatusInternal);
}

TEST_P(MessengerTest, SecondReplyThrows) {
  EchoServer echo(options());
  Client client(options(), "127.0.0.1", echo.port());
  std::vector<uint8_t> received;
  EXPECT_EQ(client.call(kOpReplyTwice, bytes_of("a"), {}, sink_into(received), kCallTimeout).status, kStatusOk);
  // The handler tries its second reply right after the first went out.
  for (int i = 0; i < 5000 && !echo.second_reply_threw(); ++i) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_TRUE(echo.second_reply_threw());
}

TEST_P(MessengerTest, CallTimesOutAndTheClientStaysUsable) {
  EchoServer echo(options());
  Client client(options(), "127.0.0.1", echo.port());
  std::vector<uint8_t> received;
  try {
    client.call(kOpHold, {}, pattern(4096, 2), sink_into(received), milliseconds(100));
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("no reply within 100 ms"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(client.connected());
  EXPECT_EQ(client.call(kOpEcho, bytes_of("after"), {}, sink_into(received), kCallTimeout).status, kStatusOk);
}

TEST_P(MessengerTest, ConnectToAClosedPortIsUnavailable) {
  uint16_t closed_port = 0;
  {
    EchoServer echo(options());
    closed_port = echo.port();
  }
  try {
    Client client(options(), "127.0.0.1", closed_port);
    FAIL() << "connected to a closed port";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("cannot connect"), std::string::npos) << e.what();
  }
}

TEST_P(MessengerTest, ManyConnectsAndDisconnectsLeaveNoPeers) {
  EchoServer echo(options());
  std::vector<uint8_t> received;
  for (int i = 0; i < 10; ++i) {
    Client client(options(), "127.0.0.1", echo.port());
    EXPECT_EQ(client.call(kOpEcho, {}, {}, sink_into(received), kCallTimeout).status, kStatusOk);
    EXPECT_GE(echo.server().peers(), 1u);
  }
  EXPECT_TRUE(echo.wait_peers_lost(10, milliseconds(5000)));
  EXPECT_EQ(echo.server().peers(), 0u);
}

TEST_P(MessengerTest, ReportsTheTransportAndCountsEndpoints) {
  metrics::Registry registry;
  TransportOptions opts = options();
  opts.metrics = &registry;
  EchoServer echo(opts);
  std::string chosen;
  {
    ::testing::internal::CaptureStderr();
    std::unique_ptr<Client> client;
    try {
      client = std::make_unique<Client>(opts, "127.0.0.1", echo.port());
    } catch (...) {
      ::testing::internal::GetCapturedStderr();
      throw;
    }
    const std::string log = ::testing::internal::GetCapturedStderr();
    chosen = client->transport();
    EXPECT_EQ(chosen, expected_transport());
    // Both ends log their endpoint; neither falls back.
    EXPECT_NE(log.find("via " + expected_transport() + " ("), std::string::npos) << log;
    EXPECT_EQ(log.find("warning"), std::string::npos) << log;
    // Client and server endpoint, once each.
    EXPECT_EQ(registry.gauge(metrics::kTransportInfo, {chosen}).value(), 2.0);
  }
  EXPECT_TRUE(echo.wait_peers_lost(1, milliseconds(5000)));
  EXPECT_EQ(registry.gauge(metrics::kTransportInfo, {chosen}).value(), 0.0);
}

// The first calls after connecting carry headers longer than a shared-memory
// eager-short message (~90 bytes): UCX must send them on the final lanes
// (the hello settles them), not replay them from the connection phase.
TEST_P(MessengerTest, LongHeadersRightAfterConnecting) {
  EchoServer echo(options());
  for (size_t header_bytes : {size_t{200}, size_t{3000}}) {
    Client client(options(), "127.0.0.1", echo.port());
    const auto header = pattern(header_bytes, static_cast<uint32_t>(header_bytes));
    const auto payload = pattern(100000, 11);
    std::vector<uint8_t> received;
    const Reply reply = client.call(kOpEcho, header, payload, sink_into(received), kCallTimeout);
    EXPECT_EQ(reply.status, kStatusOk);
    EXPECT_EQ(reply.header, header);
    EXPECT_EQ(received, payload);
  }
}

TEST_P(MessengerTest, KilledServerMidTransferFailsTheCall) {
  HelperProcess helper("server", GetParam());
  const std::string line = helper.read_line();
  ASSERT_EQ(line.rfind("port ", 0), 0u) << line;
  const auto port = static_cast<uint16_t>(std::stoi(line.substr(5)));
  Client client(options(), "127.0.0.1", port);
  const auto payload = pattern(8 << 20, 4);
  std::vector<uint8_t> received;
  try {
    client.call(kOpDieInSink, {}, payload, sink_into(received), milliseconds(60000));
    FAIL() << "the call survived a killed server";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("lost"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(client.connected());
  try {
    client.call(kOpEcho, {}, {}, sink_into(received), milliseconds(60000));
    FAIL() << "a call after the peer died went through";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
  }
}

TEST_P(MessengerTest, ServerKilledWhileACallWaitsForItsReply) {
  HelperProcess helper("server", GetParam());
  const std::string line = helper.read_line();
  ASSERT_EQ(line.rfind("port ", 0), 0u) << line;
  Client client(options(), "127.0.0.1", static_cast<uint16_t>(std::stoi(line.substr(5))));
  std::thread killer([&] {
    if (helper.read_line() == "held") helper.kill_now();
  });
  std::vector<uint8_t> received;
  try {
    client.call(kOpSignalHold, {}, pattern(1 << 20, 8), sink_into(received), milliseconds(60000));
    ADD_FAILURE() << "the call survived a killed server";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("lost"), std::string::npos) << e.what();
  }
  killer.join();
}

TEST_P(MessengerTest, KilledClientIsReportedAndOthersAreStillServed) {
  EchoServer echo(options());
  {
    HelperProcess helper("client", GetParam(), echo.port());
    ASSERT_EQ(helper.read_line(), "ready");
    EXPECT_EQ(echo.server().peers(), 1u);
    helper.kill_now();
    EXPECT_TRUE(echo.wait_peers_lost(1, milliseconds(30000)));
  }
  EXPECT_EQ(echo.server().peers(), 0u);
  Client client(options(), "127.0.0.1", echo.port());
  std::vector<uint8_t> received;
  const auto payload = pattern(4096, 6);
  EXPECT_EQ(client.call(kOpEcho, {}, payload, sink_into(received), kCallTimeout).status, kStatusOk);
  EXPECT_EQ(received, payload);
}

INSTANTIATE_TEST_SUITE_P(Transports, MessengerTest, ::testing::Values("tcp", "shm", "posix,sysv,cma,tcp"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), ',', '_');
                           return name;
                         });

TEST(Messenger, ListeningOnAnUnresolvableHostIsAnIoError) {
  ServerHandlers handlers;
  try {
    Server server(options_for("tcp"), "no-such-host.invalid", 0, handlers);
    FAIL() << "listened on an invalid host";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
  }
}

}  // namespace
}  // namespace lazykv::transport::testing
