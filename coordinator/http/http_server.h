// A small HTTP/1.1 server on Boost.Beast: one thread per connection,
// keep-alive, bodies up to a size limit, whole or streamed (chunked)
// responses. It knows nothing of the API: every request goes to one handler.
// A client that goes away is seen by the handler (write fails, client_gone())
// so it can cancel the work behind the request.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
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
  std::string body;
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

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;                 // 0: an ephemeral port (see Server::port())
  size_t max_body_bytes = 4 << 20;      // larger bodies get 413 before the handler runs
  int max_connections = 1024;           // beyond it new connections get 503 and are closed
  std::chrono::seconds idle_timeout{120};  // a keep-alive connection idle this long is closed
  ErrorBodyFn error_body;               // default: {"error": {"message": ...}}
};

class Server {
 public:
  // Binds and listens (Error(kIo) naming the address if that fails); does not accept yet.
  Server(ServerOptions options, Handler handler);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const;
  void start();           // starts the accept thread
  void stop_accepting();  // closes the listener; running connections go on
  // Closes the listener, waits up to `grace` for running requests to finish,
  // then closes every connection and joins all threads. Not from a handler
  // (it would wait for itself).
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(0));
  int active_connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lazykv::http
