// The ResponseWriter a handler thread uses: blocking writes straight to the
// connection's socket, each bounded by a timeout, so a client that stops
// reading cannot hold the thread. The connection's I/O thread does nothing
// with the socket while a handler owns it.
#pragma once

#include <atomic>
#include <chrono>

#include "coordinator/http/http_server.h"

namespace lazykv::http {

class SocketWriter final : public ResponseWriter {
 public:
  enum class State { kNothingSent, kSent, kStreaming, kStreamEnded };

  // `fd`: a connected non-blocking socket. `head`: the request was HEAD, so
  // answers have headers only. `stopping`: once set, responses no longer
  // offer keep-alive.
  SocketWriter(int fd, unsigned version, bool keep_alive, bool head, const std::atomic<bool>& stopping,
               std::chrono::milliseconds write_timeout);

  bool send(int status, std::string_view content_type, std::string body, const Headers& extra) override;
  bool start_stream(int status, std::string_view content_type, const Headers& extra) override;
  bool write_chunk(std::string_view data) override;
  bool end_stream() override;
  bool client_gone() override;

  State state() const { return state_; }
  bool gone() const { return gone_; }
  bool keep_alive() const { return keep_alive_; }

 private:
  // Writes all of `data`; false (and gone) on an error or a timeout.
  bool write_all(std::string_view data);

  int fd_;
  unsigned version_;
  bool keep_alive_;
  bool head_;
  const std::atomic<bool>& stopping_;
  std::chrono::milliseconds write_timeout_;
  bool chunked_ = true;
  bool gone_ = false;
  State state_ = State::kNothingSent;
};

}  // namespace lazykv::http
