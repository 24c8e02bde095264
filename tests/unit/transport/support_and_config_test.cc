// The transport tests' shared support (echo server, helper processes) and
// unit tests of the pieces without a network: wire header, UCX_TLS handling,
// transport naming.
#include <fcntl.h>
#include <ifaddrs.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "kvstore/transport/messenger_util.h"
#include "kvstore/transport/transport_config.h"
#include "kvstore/transport/wire.h"
#include "tests/unit/transport/test_support.h"

namespace lazykv::transport::testing {

std::vector<uint8_t> pattern(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> out(bytes);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<uint8_t>(x);
  }
  return out;
}

namespace {

// The sink of the echo server: a fresh buffer owned by the token.
PayloadSink vector_sink(size_t bytes) {
  auto storage = std::make_shared<std::vector<uint8_t>>(bytes);
  PayloadSink sink;
  sink.buffer = *storage;
  sink.token = storage;
  return sink;
}

void echo(ServerRequest& request, Responder& responder) {
  auto token = request.token;  // keeps the payload alive until it is sent
  responder.reply(kStatusOk, request.header, request.payload, [token](bool) {});
}

}  // namespace

EchoServer::EchoServer(TransportOptions options) {
  ServerHandlers handlers;
  handlers.payload_sink = [](PeerId, uint32_t op, std::span<const uint8_t>, size_t bytes) {
    if (op == kOpRefuse) return PayloadSink{};
    return vector_sink(bytes);
  };
  handlers.on_request = [this](ServerRequest&& request, Responder responder) {
    switch (request.op) {
      case kOpEcho:
        echo(request, responder);
        break;
      case kOpEchoThread: {
        std::lock_guard lock(mutex_);
        repliers_.emplace_back([request = std::move(request), responder]() mutable { echo(request, responder); });
        break;
      }
      case kOpDrop:
        break;
      case kOpHold: {
        std::lock_guard lock(mutex_);
        held_.push_back(responder);
        break;
      }
      case kOpReplyTwice:
        responder.reply(kStatusOk, request.header);
        try {
          responder.reply(kStatusOk, request.header);
        } catch (const Error& e) {
          second_reply_threw_.store(e.code() == ErrorCode::kInternal);
        }
        break;
      default:
        responder.reply(kStatusInternal, {});
    }
  };
  handlers.on_peer_lost = [this](PeerId) {
    std::lock_guard lock(mutex_);
    peers_lost_.fetch_add(1);
    lost_cv_.notify_all();
  };
  server_ = std::make_unique<Server>(std::move(options), "127.0.0.1", 0, std::move(handlers));
}

EchoServer::~EchoServer() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mutex_);
    threads.swap(repliers_);
  }
  for (auto& t : threads) t.join();
  server_.reset();
  held_.clear();  // after the server: their kStatusInternal answers go nowhere
}

bool EchoServer::wait_peers_lost(int count, std::chrono::milliseconds limit) {
  std::unique_lock lock(mutex_);
  return lost_cv_.wait_for(lock, limit, [&] { return peers_lost_.load() >= count; });
}

HelperProcess::HelperProcess(const std::string& mode, const std::string& transports, uint16_t port) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls (dup2, execve).
  const std::string spec = "LAZYKV_TRANSPORT_HELPER=" + mode + ":" + std::to_string(port) + ":" + transports;
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back(const_cast<char*>(spec.c_str()));
  env.push_back(nullptr);
  char arg0[] = "transport_helper";
  char* argv[] = {arg0, nullptr};
  pid_ = fork();
  if (pid_ == 0) {
    dup2(fds[1], STDOUT_FILENO);
    execve("/proc/self/exe", argv, env.data());
    _exit(127);
  }
  close(fds[1]);
  out_fd_ = fds[0];
}

HelperProcess::~HelperProcess() {
  kill_now();
  if (out_fd_ >= 0) close(out_fd_);
}

void HelperProcess::kill_now() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

std::string HelperProcess::read_line() {
  for (;;) {
    const size_t nl = buffered_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    char chunk[256];
    const ssize_t n = read(out_fd_, chunk, sizeof(chunk));
    if (n <= 0) return {};
    buffered_.append(chunk, static_cast<size_t>(n));
  }
}

namespace {

void say(const std::string& line) {
  const std::string text = line + "\n";
  [[maybe_unused]] ssize_t n = write(STDOUT_FILENO, text.data(), text.size());
}

[[noreturn]] void run_helper_server(const std::string& transports) {
  TransportOptions options;
  options.transports = transports;
  options.peer_timeout = std::chrono::milliseconds(1000);
  std::mutex mutex;
  std::vector<Responder> held;
  ServerHandlers handlers;
  handlers.payload_sink = [](PeerId, uint32_t op, std::span<const uint8_t>, size_t bytes) {
    if (op == kOpDieInSink) raise(SIGKILL);  // the client's payload is in flight now
    return vector_sink(bytes);
  };
  handlers.on_request = [&](ServerRequest&& request, Responder responder) {
    if (request.op == kOpSignalHold) {
      std::lock_guard lock(mutex);
      held.push_back(responder);
      say("held");
      return;
    }
    echo(request, responder);
  };
  Server server(options, "127.0.0.1", 0, std::move(handlers));
  say("port " + std::to_string(server.port()));
  for (;;) pause();
}

[[noreturn]] void run_helper_client(const std::string& transports, uint16_t port) {
  TransportOptions options;
  options.transports = transports;
  options.peer_timeout = std::chrono::milliseconds(1000);
  Client client(options, "127.0.0.1", port);
  const auto payload = pattern(4096, 1);
  client.call(kOpEcho, {}, payload, [](std::span<const uint8_t>, size_t) { return std::span<uint8_t>(); },
              std::chrono::milliseconds(5000));
  say("ready");
  for (;;) pause();
}

}  // namespace

void run_helper_if_requested() {
  const char* spec = std::getenv("LAZYKV_TRANSPORT_HELPER");  // set only for the child
  if (spec == nullptr) return;
  const std::string text = spec;
  const size_t a = text.find(':');
  const size_t b = text.find(':', a + 1);
  const std::string mode = text.substr(0, a);
  const auto port = static_cast<uint16_t>(std::stoi(text.substr(a + 1, b - a - 1)));
  const std::string transports = text.substr(b + 1);
  try {
    if (mode == "server") run_helper_server(transports);
    if (mode == "client") run_helper_client(transports, port);
  } catch (const std::exception& e) {
    std::cerr << "transport helper failed: " << e.what() << "\n";
  }
  _exit(3);
}

namespace {
// Before gtest's main runs: a helper process never reaches the tests.
[[maybe_unused]] const bool kHelperHook = (run_helper_if_requested(), true);
}  // namespace

TEST(TransportWire, RoundTripsHeaderAndUserHeader) {
  wire::Header h;
  h.request_id = 42;
  h.code = 7;
  h.payload_bytes = 1 << 20;
  const std::vector<uint8_t> user = {1, 2, 3};
  const auto bytes = wire::encode(h, user);
  const auto decoded = wire::decode(bytes.data(), bytes.size());
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(decoded->header.request_id, 42u);
  EXPECT_EQ(decoded->header.code, 7u);
  EXPECT_EQ(decoded->header.payload_bytes, 1u << 20);
  EXPECT_EQ(std::vector<uint8_t>(decoded->user_header.begin(), decoded->user_header.end()), user);
}

TEST(TransportWire, RejectsTruncatedOrForeignMessages) {
  const auto bytes = wire::encode(wire::Header{}, std::vector<uint8_t>{9, 9});
  EXPECT_FALSE(wire::decode(bytes.data(), bytes.size() - 1).has_value());
  EXPECT_FALSE(wire::decode(bytes.data(), 10).has_value());
  auto foreign = bytes;
  foreign[0] ^= 0xff;
  EXPECT_FALSE(wire::decode(foreign.data(), foreign.size()).has_value());
}

TEST(TransportWire, HelloCarriesTheHostAndStaysShort) {
  const auto bytes = wire::encode_hello({0x0123456789abcdefull});
  const auto decoded = wire::decode_hello(bytes);
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(decoded->host, 0x0123456789abcdefull);
  EXPECT_FALSE(wire::decode_hello(std::span<const uint8_t>(bytes).first(bytes.size() - 1)).has_value());
  EXPECT_FALSE(wire::decode_hello({}).has_value());
  // The whole hello message fits a sysv/posix eager-short message (93 bytes
  // in UCX 1.13 with its default FIFO element size).
  EXPECT_LE(wire::encode(wire::Header{}, bytes).size(), 93u);
}

TEST(TransportConfig, HostIdentityIsStable) {
  EXPECT_NE(host_identity().find('/'), std::string::npos);
  EXPECT_EQ(host_identity_hash(), host_identity_hash());
  EXPECT_NE(host_identity_hash(), 0u);
}

TEST(TransportConfig, KnowsWhenSharedMemoryIsEnabled) {
  EXPECT_TRUE(enables_shared_memory(""));
  EXPECT_TRUE(enables_shared_memory("shm"));
  EXPECT_TRUE(enables_shared_memory("shm,tcp"));
  EXPECT_TRUE(enables_shared_memory("posix,sysv,cma,tcp"));
  EXPECT_TRUE(enables_shared_memory("tcp,cma"));
  EXPECT_TRUE(enables_shared_memory("all"));
  EXPECT_TRUE(enables_shared_memory("^ib"));
  EXPECT_FALSE(enables_shared_memory("tcp"));
  EXPECT_FALSE(enables_shared_memory("rc,tcp"));
  EXPECT_FALSE(enables_shared_memory("^shm,tcp"));
}

namespace {
// What ucp_config_print shows of `config`: UCT options passed through
// ucp_config_modify appear as "NAME=value" lines.
std::string printed(const UcxConfig& config) {
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return {};
  ucp_config_print(config.get(), stream, "test", UCS_CONFIG_PRINT_CONFIG);
  std::fclose(stream);
  std::string out(text == nullptr ? "" : text, size);
  std::free(text);
  return out;
}
}  // namespace

// Toward a peer outside this network namespace (another pod on this host,
// or another host) a client leaves shared memory out, unless transports were
// given or UCX's TLS is configured (UCX_TLS, ucx.conf); toward this
// namespace's own addresses UCX chooses.
TEST(TransportConfig, APeerOutsideThisNetworkNamespaceGetsNoSharedMemory) {
  const auto at = [](const std::string& host) { return resolve_address(host, 7100, ErrorCode::kInvalidArgument); };
  EXPECT_TRUE(address_in_this_network_namespace(at("127.0.0.1")));
  EXPECT_TRUE(address_in_this_network_namespace(at("127.3.4.5")));
  EXPECT_TRUE(address_in_this_network_namespace(at("0.0.0.0")));
  EXPECT_FALSE(address_in_this_network_namespace(at("192.0.2.7")));  // TEST-NET-1: no interface has it
  // Every address of this namespace's interfaces is its own.
  ifaddrs* list = nullptr;
  ASSERT_EQ(getifaddrs(&list), 0);
  int checked = 0;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    sockaddr_storage own{};
    std::memcpy(&own, i->ifa_addr, sizeof(sockaddr_in));
    EXPECT_TRUE(address_in_this_network_namespace(own)) << i->ifa_name;
    ++checked;
  }
  freeifaddrs(list);
  EXPECT_GT(checked, 0);

  const char* saved = std::getenv("UCX_TLS");  // the environment is part of the rule
  const std::string environment = saved != nullptr ? saved : "";
  const auto tls_of = [](const TransportOptions& options) {
    UcxConfig config;
    apply_transport_options(config, options);
    return config.value("TLS");
  };
  ::unsetenv("UCX_TLS");
  TransportOptions outside;
  outside.peer_in_other_namespace = true;
  EXPECT_EQ(tls_of(outside), "^shm");
  EXPECT_EQ(tls_of(TransportOptions{}), "all");  // UCX's default
  outside.transports = "shm,tcp";  // asked for: kept
  EXPECT_EQ(tls_of(outside), "shm,tcp");
  outside.transports.clear();
  ::setenv("UCX_TLS", "tcp", 1);  // configured outside the program: it stands
  EXPECT_EQ(tls_of(outside), "tcp");
  if (saved != nullptr) {
    ::setenv("UCX_TLS", environment.c_str(), 1);
  } else {
    ::unsetenv("UCX_TLS");
  }
}

TEST(TransportConfig, SharedMemoryTurnsOnItsPeerFailureSupport) {
  TransportOptions options;
  options.transports = "shm";
  UcxConfig with_shm;
  apply_transport_options(with_shm, options);
  const std::string shm_text = printed(with_shm);
  EXPECT_NE(shm_text.find("MM_ERROR_HANDLING=y"), std::string::npos) << shm_text;
  EXPECT_NE(shm_text.find("MEMORY_INVALIDATE=y"), std::string::npos) << shm_text;

  options.transports = "tcp";
  UcxConfig tcp_only;
  apply_transport_options(tcp_only, options);
  const std::string tcp_text = printed(tcp_only);
  EXPECT_EQ(tcp_text.find("MM_ERROR_HANDLING"), std::string::npos) << tcp_text;
  EXPECT_EQ(tcp_text.find("MEMORY_INVALIDATE"), std::string::npos) << tcp_text;
}

TEST(TransportConfig, TcpIsAFallbackOnlyWhereAFasterTransportCouldReach) {
  EXPECT_TRUE(is_transport_fallback("tcp", "shm,tcp", /*same_host=*/true));
  EXPECT_FALSE(is_transport_fallback("tcp", "shm,tcp", /*same_host=*/false));  // shm never crosses hosts
  EXPECT_TRUE(is_transport_fallback("tcp", "rc,tcp", /*same_host=*/false));
  EXPECT_TRUE(is_transport_fallback("tcp", "posix,sysv,cma,tcp", /*same_host=*/true));
  EXPECT_FALSE(is_transport_fallback("shm", "shm,tcp", /*same_host=*/true));
  EXPECT_FALSE(is_transport_fallback("rdma", "rc,tcp", /*same_host=*/false));
  EXPECT_FALSE(is_transport_fallback("tcp", "tcp", /*same_host=*/true));
  EXPECT_FALSE(is_transport_fallback("tcp", "", /*same_host=*/true));
}

TEST(TransportConfig, AddsTcpForTheConnectionManager) {
  EXPECT_EQ(effective_tls(""), "");
  EXPECT_EQ(effective_tls("tcp"), "tcp");
  EXPECT_EQ(effective_tls("shm"), "shm,tcp");
  EXPECT_EQ(effective_tls("posix,sysv,cma"), "posix,sysv,cma,tcp");
  EXPECT_EQ(effective_tls("shm,tcp"), "shm,tcp");
  EXPECT_EQ(effective_tls("^ib"), "^ib");
}

TEST(TransportConfig, NamesTransportClasses) {
  EXPECT_EQ(transport_class("posix"), "shm");
  EXPECT_EQ(transport_class("cma"), "shm");
  EXPECT_EQ(transport_class("tcp"), "tcp");
  EXPECT_EQ(transport_class("rc_mlx5"), "rdma");
  EXPECT_EQ(transport_class("cuda_ipc"), "cuda");
  EXPECT_EQ(primary_transport({"tcp", "posix", "cma"}), "shm");
  EXPECT_EQ(primary_transport({"tcp"}), "tcp");
  EXPECT_EQ(primary_transport({}), "unknown");
}

TEST(TransportConfig, KnowsWhenTcpIsAFallback) {
  EXPECT_TRUE(requests_fast_transport("shm,tcp"));
  EXPECT_TRUE(requests_fast_transport("rc,tcp"));
  EXPECT_FALSE(requests_fast_transport("tcp"));
  EXPECT_FALSE(requests_fast_transport("^shm,tcp"));
  EXPECT_FALSE(requests_fast_transport(""));
}

TEST(TransportConfig, RejectsAnInvalidSetting) {
  UcxConfig config;
  try {
    config.set("KEEPALIVE_INTERVAL", "not-a-duration");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("ucp_config_modify"), std::string::npos);
  }
}

}  // namespace lazykv::transport::testing
