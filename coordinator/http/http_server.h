// A small HTTP/1.1 server on Boost.Beast and Asio: keep-alive, bodies up to a
// size limit, whole or streamed (chunked) responses. It knows nothing of the
// API: every request goes to one handler.
//
// Connections cost memory, not threads: a few I/O threads read every
// request asynchronously, each read bounded by a deadline (the whole header,
// the body at a minimum rate, the idle time between requests), so a slow or
// silent client cannot hold anything for long. Only a request read whole is
// handed to a handler thread, which may block (generation streams from
// there); probe paths (/health, /ready) are answered on the I/O threads and
// never wait for a handler thread. A client that goes away is seen by the
// handler (write fails, client_gone()) so it can cancel the work behind it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lazykv::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without the query string, e.g. "/v1/completions"
  std::string query;   // after '?', or ""
  Headers headers;     // names lower-cased, in arrival order
  std::string body;    // empty when seen by ServerOptions::check_header
  std::string remote;  // "ip:port" of the client

  // The first header of that (lower-case) name, or "".
  std::string_view header(std::string_view name) const;
};

// How the handler answers one request. Used from the handler's thread only.
// Exactly one of send() or start_stream() ... end_stream() per request.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // A whole response with Content-Length. Returns false if the client is gone.
  virtual bool send(int status, std::string_view content_type, std::string body, const Headers& extra = {}) = 0;
  // A streamed response (Transfer-Encoding: chunked): headers now, then
  // chunks, each written and flushed at once. All return false once the
  // client is gone; the handler should then stop and clean up.
  virtual bool start_stream(int status, std::string_view content_type, const Headers& extra = {}) = 0;
  virtual bool write_chunk(std::string_view data) = 0;
  virtual bool end_stream() = 0;
  // True when the client has closed its side (checked without blocking), so
  // a handler waiting for a whole response can cancel early.
  virtual bool client_gone() = 0;
};

using Handler = std::function<void(const Request&, ResponseWriter&)>;
// Body of an error the server answers itself (oversize body, bad HTTP):
// status, message -> JSON body.
using ErrorBodyFn = std::function<std::string(int status, const std::string& message)>;

// An answer given from the request's header alone, before its body is read.
struct EarlyAnswer {
  int status = 0;
  std::string body;
  Headers headers;
  std::string content_type = "application/json";
};
// Sees each request's method, path and headers (no body) on an I/O thread;
// must not block. An answer it returns is sent instead of reading the body,
// and the connection then closes. Used to refuse a wrong API key before a
// 4 MiB body costs memory.
using HeaderCheck = std::function<std::optional<EarlyAnswer>(const Request& head)>;

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;                 // 0: an ephemeral port (see Server::port())
  size_t max_body_bytes = 4 << 20;      // larger bodies get 413 before the handler runs
  // Bodies being read or handled, all connections together; a request whose
  // body would pass it gets 503 at its header (a chunked body counts as
  // max_body_bytes). Bounds the memory a flood of large bodies can take.
  size_t max_body_memory = size_t(256) << 20;
  int max_connections = 10000;          // beyond it new connections get 503 (probe_slots aside)
  int max_connections_per_address = 256;  // from one client address; 0: no limit (behind a proxy)
  // Connections taken past either cap that may only ask for a probe path,
  // within probe_header_timeout, so that liveness and readiness probes are
  // answered while the caps are full.
  int probe_slots = 32;
  std::vector<std::string> probe_paths = {"/health", "/ready"};  // the handler must not block for these
  std::chrono::milliseconds header_timeout{10'000};  // request line and headers, whole
  std::chrono::milliseconds probe_header_timeout{2'000};
  // The body must arrive within body_timeout plus one second for every
  // min_body_rate bytes received (Apache's mod_reqtimeout rule).
  std::chrono::milliseconds body_timeout{10'000};
  size_t min_body_rate = 1024;                           // bytes per second; 0: body_timeout for the whole body
  std::chrono::milliseconds keep_alive_timeout{60'000};  // idle between requests
  std::chrono::milliseconds write_timeout{60'000};       // one write the client does not take in
  int io_threads = 2;
  int handler_threads = 512;  // requests handled at once; more wait for a thread, unread
  HeaderCheck check_header;   // optional
  // Called for each answer the server gives itself (400, 408, 413, 431,
  // 503), so they can be counted; from an I/O thread, must not block.
  std::function<void(int status)> on_own_answer;
  ErrorBodyFn error_body;  // default: {"error": {"message": ...}}
};

class Server {
 public:
  // Binds and listens (Error(kIo) naming the address if that fails); does not accept yet.
  Server(ServerOptions options, Handler handler);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const;
  void start();           // starts the I/O threads and accepting
  void stop_accepting();  // closes the listener; running connections go on
  // Closes the listener and every idle connection, waits up to `grace` for
  // running requests to finish, then cuts the connections still running
  // (their handlers see writes fail) and waits for their handlers to return.
  // Not from a handler (it would wait for itself).
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(0));
  // Connections open now (those being turned away aside).
  int active_connections() const;
  // Body bytes reserved now against max_body_memory.
  size_t body_memory_in_use() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lazykv::http
