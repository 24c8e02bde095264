// Shared pieces of the transport tests: an echo server with a few test ops,
// byte patterns, and a helper process (this test binary re-executed with
// LAZYKV_TRANSPORT_HELPER set) to kill with SIGKILL.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "kvstore/transport/messenger.h"

namespace lazykv::transport::testing {

// Ops of the echo server.
inline constexpr uint32_t kOpEcho = 1;          // reply: same header, same payload
inline constexpr uint32_t kOpEchoThread = 2;    // as kOpEcho, replied from another thread
inline constexpr uint32_t kOpDrop = 3;          // the handler drops the Responder
inline constexpr uint32_t kOpHold = 4;          // the handler keeps the Responder, never replies
inline constexpr uint32_t kOpReplyTwice = 5;    // replies, then replies again (must throw)
inline constexpr uint32_t kOpRefuse = 6;        // the payload sink refuses
inline constexpr uint32_t kOpDieInSink = 7;     // (helper only) SIGKILLs itself in the payload sink
inline constexpr uint32_t kOpSignalHold = 8;    // (helper only) like kOpHold, prints "held" first

std::vector<uint8_t> pattern(size_t bytes, uint32_t seed);

// An in-process echo server on 127.0.0.1 (any port).
class EchoServer {
 public:
  explicit EchoServer(TransportOptions options);
  ~EchoServer();
  Server& server() { return *server_; }
  uint16_t port() const { return server_->port(); }
  bool second_reply_threw() const { return second_reply_threw_.load(); }
  // Waits (up to `limit`) until on_peer_lost fired `count` times in total.
  bool wait_peers_lost(int count, std::chrono::milliseconds limit);
  int peers_lost() const { return peers_lost_.load(); }

 private:
  std::atomic<bool> second_reply_threw_{false};
  std::atomic<int> peers_lost_{0};
  std::mutex mutex_;
  std::condition_variable lost_cv_;
  std::vector<Responder> held_;
  std::vector<std::thread> repliers_;
  std::unique_ptr<Server> server_;
};

// A child process running this binary in a helper mode.
class HelperProcess {
 public:
  // mode "server": prints "port <n>" and serves kvstore requests (echo ops,
  // kOpDieInSink, kOpSignalHold). mode "client": connects to `port`, makes one
  // echo call, prints "ready", then sleeps.
  HelperProcess(const std::string& mode, const std::string& transports, uint16_t port = 0);
  ~HelperProcess();  // SIGKILLs and reaps the child if still running
  // Next line the child printed (without '\n'); empty at EOF.
  std::string read_line();
  void kill_now();

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string buffered_;
};

// Runs the helper mode if this process was started as one (never returns then).
void run_helper_if_requested();

}  // namespace lazykv::transport::testing
