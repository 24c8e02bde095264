// Asio's synchronous socket calls have no deadline, so each step is an async
// operation run on a private io_context in short slices: between slices the
// deadline (tcp_stream's expiry) and the client's presence are checked.
#include "coordinator/router/upstream.h"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string_view>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace lazykv::router {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

constexpr auto kSlice = std::chrono::milliseconds(100);  // how often the client's presence is checked
constexpr size_t kRelayChunkBytes = 16 << 10;

std::string_view view(boost::beast::string_view s) { return {s.data(), s.size()}; }

bool is_one_of(std::string_view name, std::initializer_list<std::string_view> names) {
  const boost::beast::string_view n(name.data(), name.size());
  for (std::string_view candidate : names) {
    if (beast::iequals(n, boost::beast::string_view(candidate.data(), candidate.size()))) return true;
  }
  return false;
}

// Hop-by-hop headers (RFC 9110 section 7.6.1), and those the proxy sets on
// the message it sends (Host, the body's length), in either direction.
bool is_hop_header(std::string_view name) {
  return is_one_of(name, {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
                          "upgrade", "host", "content-length", "expect"});
}

// Of a replica's answer, what the client gets besides the status, the
// content type (passed on its own) and what the router's server writes.
bool is_relayed_response_header(std::string_view name) {
  return !is_hop_header(name) && !is_one_of(name, {"content-type", "date", "server"});
}

class Exchange {
 public:
  explicit Exchange(std::function<bool()> cancelled) : cancelled_(std::move(cancelled)) {}

  // Runs the async operation `start` begins until its handler runs, closing
  // the socket if the deadline passes or the client goes away.
  template <class Start>
  beast::error_code run(std::chrono::milliseconds timeout, Start start) {
    std::optional<beast::error_code> result;
    stream.expires_after(timeout);
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    ioc_.restart();
    while (!result) {
      ioc_.run_for(kSlice);
      if (!result && cancelled_ && cancelled_()) {
        client_gone = true;
        stream.close();  // the handler then runs with operation_aborted
      }
    }
    return *result;
  }

  bool connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout, std::string& error) {
    beast::error_code ec;
    const auto endpoints = tcp::resolver(ioc_).resolve(host, std::to_string(port), ec);
    if (ec) {
      error = "cannot resolve " + host + ": " + ec.message();
      return false;
    }
    ec = run(timeout, [&](auto handler) { stream.async_connect(endpoints, handler); });
    if (ec) error = "cannot connect to " + host + ":" + std::to_string(port) + ": " + ec.message();
    return !ec;
  }

 private:
  net::io_context ioc_;
  std::function<bool()> cancelled_;

 public:
  beast::tcp_stream stream{ioc_};
  beast::flat_buffer buffer;
  bool client_gone = false;
};

bhttp::request<bhttp::string_body> upstream_request(const http::Request& in, const std::string& host, uint16_t port) {
  bhttp::request<bhttp::string_body> req;
  req.method_string(in.method);
  req.target(in.query.empty() ? in.path : in.path + "?" + in.query);
  req.version(11);
  for (const auto& [name, value] : in.headers) {
    if (!is_hop_header(name)) req.insert(name, value);
  }
  req.set(bhttp::field::host, host + ":" + std::to_string(port));
  req.set(bhttp::field::connection, "close");
  if (!in.remote.empty()) req.set("x-forwarded-for", in.remote.substr(0, in.remote.rfind(':')));
  req.body() = in.body;
  req.prepare_payload();
  return req;
}

// Reads the rest of a streamed answer into `out`, chunk by chunk.
UpstreamOutcome relay_stream(Exchange& x, bhttp::response_parser<bhttp::buffer_body>& parser, http::ResponseWriter& out,
                             const UpstreamOptions& options,
                             const std::function<std::string(const std::string&)>& stream_error) {
  UpstreamOutcome outcome{UpstreamResult::kAnswered, int(parser.get().result_int()), ""};
  std::array<char, kRelayChunkBytes> piece;
  std::string tail;  // the last two bytes relayed: whether an SSE event was cut short
  while (!parser.is_done()) {
    parser.get().body().data = piece.data();
    parser.get().body().size = piece.size();
    // read_some: hand on what has arrived (a whole read would wait for the buffer to fill).
    beast::error_code ec = x.run(options.read_timeout, [&](auto handler) {
      bhttp::async_read_some(x.stream, x.buffer, parser, handler);
    });
    if (ec == bhttp::error::need_buffer) ec = {};
    const size_t n = piece.size() - parser.get().body().size;
    if (n > 0 && !out.write_chunk(std::string_view(piece.data(), n))) x.client_gone = true;
    tail = (tail + std::string(piece.data() + n - std::min<size_t>(n, 2), std::min<size_t>(n, 2)));
    if (tail.size() > 2) tail.erase(0, tail.size() - 2);
    if (x.client_gone) return {UpstreamResult::kClientGone, outcome.status, "the client went away"};
    if (ec) {
      outcome = {UpstreamResult::kFailedMidStream, outcome.status, "the replica's stream broke: " + ec.message()};
      // End a half-relayed event first, so the error is an event of its own.
      if (!tail.empty() && tail != "\n\n") out.write_chunk("\n\n");
      if (stream_error) out.write_chunk(stream_error(outcome.error));
      out.end_stream();
      return outcome;
    }
  }
  out.end_stream();
  return outcome;
}

}  // namespace

UpstreamOutcome forward_request(const std::string& host, uint16_t port, const http::Request& request,
                                http::ResponseWriter& out, const UpstreamOptions& options, const http::Headers& added,
                                const std::function<std::string(const std::string& error)>& stream_error) {
  Exchange x([&out] { return out.client_gone(); });
  UpstreamOutcome outcome;
  if (!x.connect(host, port, options.connect_timeout, outcome.error)) {
    if (x.client_gone) outcome.result = UpstreamResult::kClientGone;
    return outcome;
  }
  bhttp::request<bhttp::string_body> req = upstream_request(request, host, port);
  const beast::error_code sent = x.run(options.connect_timeout, [&](auto handler) {
    bhttp::async_write(x.stream, req, handler);
  });
  if (x.client_gone) return {UpstreamResult::kClientGone, 0, "the client went away"};

  bhttp::response_parser<bhttp::buffer_body> parser;
  // Boost 1.74 compares a Content-Length with an unset limit as if it were exceeded: set the largest one.
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  if (request.method == "HEAD") parser.skip(true);  // its Content-Length announces no body
  // After a failed send, a replica may still have answered (refusing the
  // request from its header, say): relay that; if there is none, the
  // replica never had the whole request.
  const beast::error_code read = x.run(sent ? options.connect_timeout : options.read_timeout, [&](auto handler) {
    bhttp::async_read_header(x.stream, x.buffer, parser, handler);
  });
  if (x.client_gone) return {UpstreamResult::kClientGone, 0, "the client went away"};
  if (read && sent) return {UpstreamResult::kNotDelivered, 0, "sending to the replica failed: " + sent.message()};
  if (read) return {UpstreamResult::kFailedBeforeAnswer, 0, "the replica failed before answering: " + read.message()};

  const auto& head = parser.get();
  const int status = int(head.result_int());
  http::Headers extra = added;
  for (const auto& field : head) {
    if (is_relayed_response_header(view(field.name_string()))) {
      extra.emplace_back(view(field.name_string()), view(field.value()));
    }
  }
  const std::string content_type(view(head[bhttp::field::content_type]));
  if (parser.chunked()) {
    if (!out.start_stream(status, content_type, extra)) return {UpstreamResult::kClientGone, status, "the client went away"};
    return relay_stream(x, parser, out, options, stream_error);
  }
  std::string body;
  std::array<char, kRelayChunkBytes> piece;
  while (!parser.is_done()) {
    parser.get().body().data = piece.data();
    parser.get().body().size = piece.size();
    beast::error_code ec = x.run(options.read_timeout, [&](auto handler) { bhttp::async_read(x.stream, x.buffer, parser, handler); });
    if (ec == bhttp::error::need_buffer) ec = {};
    body.append(piece.data(), piece.size() - parser.get().body().size);
    if (x.client_gone) return {UpstreamResult::kClientGone, status, "the client went away"};
    if (ec) return {UpstreamResult::kFailedBeforeAnswer, status, "the replica's answer broke off: " + ec.message()};
  }
  if (!out.send(status, content_type, std::move(body), extra)) {
    return {UpstreamResult::kClientGone, status, "the client went away"};
  }
  return {UpstreamResult::kAnswered, status, ""};
}

int probe(const std::string& host, uint16_t port, const std::string& path, std::chrono::milliseconds timeout) {
  Exchange x(nullptr);
  std::string error;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (!x.connect(host, port, timeout, error)) return 0;
  bhttp::request<bhttp::empty_body> req{bhttp::verb::get, path, 11};
  req.set(bhttp::field::host, host + ":" + std::to_string(port));
  req.set(bhttp::field::connection, "close");
  auto left = [deadline] {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - std::chrono::steady_clock::now()));
  };
  if (x.run(left(), [&](auto handler) { bhttp::async_write(x.stream, req, handler); })) return 0;
  bhttp::response<bhttp::string_body> res;
  if (x.run(left(), [&](auto handler) { bhttp::async_read(x.stream, x.buffer, res, handler); })) return 0;
  return int(res.result_int());
}

}  // namespace lazykv::router
