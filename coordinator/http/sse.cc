#include "coordinator/http/sse.h"

namespace lazykv::http {

std::string sse_event(std::string_view data) {
  std::string event;
  event.reserve(data.size() + 8);
  event += "data: ";
  for (size_t i = 0; i < data.size(); ++i) {
    const char c = data[i];
    if (c == '\r' || c == '\n') {
      if (c == '\r' && i + 1 < data.size() && data[i + 1] == '\n') ++i;
      event += "\ndata: ";
    } else {
      event += c;
    }
  }
  event += "\n\n";
  return event;
}

}  // namespace lazykv::http
