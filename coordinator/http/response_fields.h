// What every response of the server carries, whether a handler writes it
// (socket_writer.cc) or the server answers itself (connection.cc).
#pragma once

#include <boost/beast/http.hpp>
#include <string>
#include <string_view>

#include "common/error.h"
#include "coordinator/http/http_server.h"

namespace lazykv::http {

inline boost::beast::string_view to_beast(std::string_view text) { return {text.data(), text.size()}; }

inline void validate_status(int status) {
  if (status < 100 || status > 999) throw Error(ErrorCode::kInternal, "invalid HTTP status " + std::to_string(status));
}

template <class Body>
void set_common_fields(boost::beast::http::response<Body>& response, std::string_view content_type,
                       const Headers& extra) {
  response.set(boost::beast::http::field::server, "lazykv");
  response.set(boost::beast::http::field::content_type, to_beast(content_type));
  for (const auto& [name, value] : extra) response.insert(to_beast(name), to_beast(value));
}

}  // namespace lazykv::http
