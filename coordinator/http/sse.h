// Server-sent events framing (text/event-stream) for streamed API responses.
#pragma once

#include <string>
#include <string_view>

namespace lazykv::http {

// One event carrying `data`: "data: <data>\n\n". A multi-line payload gets
// one "data: " line per line, as the SSE format requires ("\r\n", "\r" and
// "\n" all end a line), so the client reassembles it with "\n".
std::string sse_event(std::string_view data);

}  // namespace lazykv::http
