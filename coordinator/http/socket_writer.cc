#include "coordinator/http/socket_writer.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <climits>

#include "coordinator/http/response_fields.h"

namespace lazykv::http {
namespace {

namespace net = boost::asio;
namespace bhttp = boost::beast::http;
using boost::beast::error_code;
using Clock = std::chrono::steady_clock;

// Waits until `fd` is writable (or hung up) or `deadline` passes. False on timeout.
bool wait_writable(int fd, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    const int timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX));
    pollfd entry{fd, POLLOUT, 0};
    const int ready = ::poll(&entry, 1, timeout_ms);
    if (ready > 0) return true;
    if (ready == 0) {
      if (timeout_ms == 0) return false;
      continue;  // woke a little early: re-check the deadline
    }
    if (errno != EINTR) return true;  // let the next send report the error
  }
}

// A non-blocking socket as a Beast SyncWriteStream whose every write waits
// at most `timeout` for the client to take bytes in. Shutting the socket
// down (Server::stop) fails a waiting write at once.
class BlockingSocket {
 public:
  BlockingSocket(int fd, std::chrono::milliseconds timeout) : fd_(fd), timeout_(timeout) {}

  // Sends as much of `buffers` as one sendmsg() takes (all of a small chunk:
  // one segment on the wire, nothing held back).
  template <class ConstBufferSequence>
  size_t write_some(const ConstBufferSequence& buffers, error_code& ec) {
    ec = {};
    constexpr size_t kMaxSegments = 64;
    iovec segments[kMaxSegments];
    size_t count = 0;
    for (auto it = net::buffer_sequence_begin(buffers); it != net::buffer_sequence_end(buffers) && count < kMaxSegments;
         ++it) {
      const net::const_buffer buffer(*it);
      if (buffer.size() == 0) continue;
      segments[count].iov_base = const_cast<void*>(buffer.data());
      segments[count].iov_len = buffer.size();
      ++count;
    }
    if (count == 0) return 0;
    msghdr message{};
    message.msg_iov = segments;
    message.msg_iovlen = count;
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      const ssize_t n = ::sendmsg(fd_, &message, MSG_NOSIGNAL);
      if (n >= 0) return static_cast<size_t>(n);
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        ec = error_code(errno, boost::system::system_category());
        return 0;
      }
      if (!wait_writable(fd_, deadline)) {
        ec = net::error::timed_out;
        return 0;
      }
    }
  }

  template <class ConstBufferSequence>
  size_t write_some(const ConstBufferSequence& buffers) {
    error_code ec;
    const size_t n = write_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }

 private:
  int fd_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

SocketWriter::SocketWriter(int fd, unsigned version, bool keep_alive, bool head, const std::atomic<bool>& stopping,
                           std::chrono::milliseconds write_timeout)
    : fd_(fd), version_(version), keep_alive_(keep_alive), head_(head), stopping_(stopping),
      write_timeout_(write_timeout) {}

bool SocketWriter::send(int status, std::string_view content_type, std::string body, const Headers& extra) {
  if (state_ != State::kNothingSent) throw Error(ErrorCode::kInternal, "ResponseWriter::send: a response was already started");
  validate_status(status);
  state_ = State::kSent;
  if (gone_) return false;
  if (stopping_) keep_alive_ = false;
  bhttp::response<bhttp::string_body> response;
  response.version(version_);
  response.result(static_cast<unsigned>(status));
  set_common_fields(response, content_type, extra);
  response.keep_alive(keep_alive_);
  response.body() = std::move(body);
  response.prepare_payload();
  BlockingSocket stream(fd_, write_timeout_);
  error_code ec;
  if (head_) {
    bhttp::response_serializer<bhttp::string_body> serializer(response);
    bhttp::write_header(stream, serializer, ec);
  } else {
    bhttp::write(stream, response, ec);
  }
  if (ec) gone_ = true;
  return !gone_;
}

bool SocketWriter::start_stream(int status, std::string_view content_type, const Headers& extra) {
  if (state_ != State::kNothingSent) {
    throw Error(ErrorCode::kInternal, "ResponseWriter::start_stream: a response was already started");
  }
  validate_status(status);
  state_ = State::kStreaming;
  if (gone_) return false;
  if (stopping_) keep_alive_ = false;
  bhttp::response<bhttp::empty_body> response;
  response.version(version_);
  response.result(static_cast<unsigned>(status));
  set_common_fields(response, content_type, extra);
  // HTTP/1.0 has no chunked encoding: the body then ends when the
  // connection closes.
  chunked_ = version_ >= 11;
  if (!chunked_) keep_alive_ = false;
  response.chunked(chunked_);
  response.keep_alive(keep_alive_);
  bhttp::response_serializer<bhttp::empty_body> serializer(response);
  BlockingSocket stream(fd_, write_timeout_);
  error_code ec;
  bhttp::write_header(stream, serializer, ec);
  if (ec) gone_ = true;
  return !gone_;
}

bool SocketWriter::write_chunk(std::string_view data) {
  if (state_ != State::kStreaming) throw Error(ErrorCode::kInternal, "ResponseWriter::write_chunk outside a stream");
  if (gone_) return false;
  if (data.empty() || head_) return true;  // an empty chunk would end the stream
  BlockingSocket stream(fd_, write_timeout_);
  error_code ec;
  const net::const_buffer payload(data.data(), data.size());
  if (chunked_) {
    net::write(stream, bhttp::make_chunk(payload), ec);
  } else {
    net::write(stream, payload, ec);
  }
  if (ec) gone_ = true;
  return !gone_;
}

bool SocketWriter::end_stream() {
  if (state_ != State::kStreaming) throw Error(ErrorCode::kInternal, "ResponseWriter::end_stream outside a stream");
  state_ = State::kStreamEnded;
  if (gone_) return false;
  if (!chunked_ || head_) return true;  // HTTP/1.0: ended by closing the connection
  BlockingSocket stream(fd_, write_timeout_);
  error_code ec;
  net::write(stream, bhttp::make_chunk_last(), ec);
  if (ec) gone_ = true;
  return !gone_;
}

bool SocketWriter::client_gone() {
  if (gone_) return true;
  pollfd entry{fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&entry, 1, 0) <= 0) return false;
  if (entry.revents & (POLLERR | POLLHUP | POLLNVAL)) {
    gone_ = true;
  } else if (entry.revents & (POLLIN | POLLRDHUP)) {
    // Readable: either the client closed (recv gives 0 or an error) or
    // it already sent its next request (pipelining) and is still there.
    char byte;
    const ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) gone_ = true;
  }
  return gone_;
}

}  // namespace lazykv::http
