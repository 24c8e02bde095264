// One request forwarded to a replica over HTTP/1.1, its answer relayed to the
// client as it arrives: a chunked (streamed) answer chunk by chunk, a whole
// one whole. Each request opens its own connection, so a replica's failure
// touches only the requests on it. Every network wait has a deadline (the
// name lookup is the system resolver's), and the client's going away is
// checked while waiting, which closes the replica connection so the replica
// cancels the generation.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "coordinator/http/http_server.h"

namespace lazykv::router {

struct UpstreamOptions {
  std::chrono::milliseconds connect_timeout{2'000};  // to connect, and again to send the request
  // Longest silence from the replica once the request is sent (a whole
  // answer is silent until the generation ends).
  std::chrono::milliseconds read_timeout{600'000};
};

enum class UpstreamResult {
  kAnswered,           // the replica's answer reached the client (whatever its status)
  kNotDelivered,       // the replica never took the request (no connection or the send failed): safe to retry
  kFailedBeforeAnswer, // the replica took it, then failed before answering; nothing was sent to the client
  kFailedMidStream,    // failed after a streamed answer had started; the stream was ended
  kClientGone,         // the client went away; the replica connection was closed
};

struct UpstreamOutcome {
  UpstreamResult result = UpstreamResult::kNotDelivered;
  int status = 0;     // the replica's HTTP status when it answered
  std::string error;  // what failed, for logs and error bodies
};

// Sends `request` (method, path, query, body, end-to-end headers) to
// host:port and relays the answer to `out`, with `added` among its headers.
// On kFailedMidStream the stream gets `stream_error` (an SSE error event,
// say) before it ends.
UpstreamOutcome forward_request(const std::string& host, uint16_t port, const http::Request& request,
                                http::ResponseWriter& out, const UpstreamOptions& options, const http::Headers& added,
                                const std::function<std::string(const std::string& error)>& stream_error);

// GET host:port/path within `timeout`; the HTTP status, or 0 when there was
// no answer.
int probe(const std::string& host, uint16_t port, const std::string& path, std::chrono::milliseconds timeout);

}  // namespace lazykv::router
