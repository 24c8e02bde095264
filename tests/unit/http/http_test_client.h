// Test clients for the HTTP server: a raw socket client for protocol cases
// (exact bytes, keep-alive, pipelining, disconnects) and curl for checking
// that a real client understands the server. Every wait has a deadline so a
// broken server fails a test instead of hanging it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>

namespace lazykv::http::testing {

constexpr auto kDeadline = std::chrono::seconds(20);

// Polls `done` until it holds or `limit` passes; returns its last value.
inline bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds limit = kDeadline) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

inline std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

struct RawResponse {
  std::string version;  // "HTTP/1.1"
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked

  std::string header(const std::string& name) const {
    const auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

class RawClient {
 public:
  // `source`: the local address to connect from (any of 127.0.0.0/8 is this
  // machine), so that one test can play several clients.
  explicit RawClient(uint16_t port, const char* source = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw std::runtime_error("socket failed");
    timeval timeout{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    if (source != nullptr) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      ::inet_pton(AF_INET, source, &local.sin_addr);
      if (::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
        throw std::runtime_error(std::string("bind to ") + source + " failed");
      }
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  }
  ~RawClient() { close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return connected_; }

  void send(const std::string& data) {
    size_t sent = 0;
    while (sent < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("send failed");
      sent += static_cast<size_t>(n);
    }
  }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Reads more bytes into the buffer. False on EOF or error (a 10 s
  // receive timeout counts as error).
  bool fill() {
    char chunk[4096];
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n <= 0) {
      eof_ = n == 0;
      return false;
    }
    buffer_.append(chunk, static_cast<size_t>(n));
    return true;
  }

  // Reads until `text` is in the buffer (true) or the stream ends (false).
  bool read_until(const std::string& text) {
    while (buffer_.find(text) == std::string::npos) {
      if (!fill()) return false;
    }
    return true;
  }

  // True when the server closed the connection (EOF), false on timeout.
  bool read_until_closed() {
    while (fill()) {
    }
    return eof_;
  }

  const std::string& buffer() const { return buffer_; }

  // One whole response from the buffer/socket; throws if it is incomplete.
  // `no_body`: the answer to a HEAD request.
  RawResponse read_response(bool no_body = false) {
    if (!read_until("\r\n\r\n")) throw std::runtime_error("no response header; got: " + buffer_);
    const size_t header_end = buffer_.find("\r\n\r\n");
    const std::string head = buffer_.substr(0, header_end);
    buffer_.erase(0, header_end + 4);
    RawResponse response;
    size_t line_end = head.find("\r\n");
    const std::string status_line = head.substr(0, line_end);
    response.version = status_line.substr(0, status_line.find(' '));
    response.status = std::atoi(status_line.c_str() + status_line.find(' ') + 1);
    while (line_end != std::string::npos) {
      const size_t start = line_end + 2;
      line_end = head.find("\r\n", start);
      const std::string line = head.substr(start, line_end == std::string::npos ? std::string::npos : line_end - start);
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      response.headers[lower(line.substr(0, colon))] = value;
    }
    if (response.status == 100 || no_body) return response;
    if (response.headers.count("content-length")) {
      const size_t length = std::stoul(response.headers["content-length"]);
      while (buffer_.size() < length) {
        if (!fill()) throw std::runtime_error("truncated body");
      }
      response.body = buffer_.substr(0, length);
      buffer_.erase(0, length);
    } else if (lower(response.headers["transfer-encoding"]) == "chunked") {
      for (;;) {
        if (!read_until("\r\n")) throw std::runtime_error("truncated chunk size");
        const size_t size_end = buffer_.find("\r\n");
        const size_t size = std::stoul(buffer_.substr(0, size_end), nullptr, 16);
        while (buffer_.size() < size_end + 2 + size + 2) {
          if (!fill()) throw std::runtime_error("truncated chunk");
        }
        response.body += buffer_.substr(size_end + 2, size);
        buffer_.erase(0, size_end + 2 + size + 2);
        if (size == 0) break;
      }
    } else {  // ends when the server closes
      read_until_closed();
      response.body = buffer_;
      buffer_.clear();
    }
    return response;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  std::string buffer_;
};

inline const char* kCurl = "/usr/bin/curl";

inline bool have_curl() { return ::access(kCurl, X_OK) == 0; }

// Runs a shell command and returns its standard output.
inline std::string run_command(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed: " + command);
  std::string output;
  char chunk[4096];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof chunk, pipe)) > 0) output.append(chunk, n);
  ::pclose(pipe);
  return output;
}

struct CurlResult {
  int status = 0;
  std::string output;  // what curl wrote (body, or headers and body with -i)
};

// curl with `arguments` against http://127.0.0.1:port`path`; the status
// comes from -w '%{http_code}' on a line of its own at the end.
inline CurlResult curl(uint16_t port, const std::string& path, const std::string& arguments = "",
                       const std::string& stdin_command = "") {
  std::string command = stdin_command.empty() ? "" : stdin_command + " | ";
  command += std::string(kCurl) + " -sS --max-time 20 -w '\\n%{http_code}' " + arguments + " 'http://127.0.0.1:" +
             std::to_string(port) + path + "'";
  std::string output = run_command(command);
  CurlResult result;
  const size_t last_newline = output.rfind('\n');
  if (last_newline == std::string::npos) return result;
  result.status = std::atoi(output.c_str() + last_newline + 1);
  result.output = output.substr(0, last_newline);
  return result;
}

}  // namespace lazykv::http::testing
