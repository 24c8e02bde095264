// The HTTP server's limits as flags of `lazykv serve` and `lazykv
// coordinator` (docs/serving.md compares their defaults with nginx's and
// uvicorn's), and the file-descriptor limit they need.
#pragma once

#include "common/flags.h"
#include "coordinator/http/http_server.h"

namespace lazykv {

// --max-body-bytes and the --http-* limits.
void add_http_flags(Flags& flags);

// The listener's options from the flags (Error(kInvalidArgument) for values
// out of range). Raises this process's open-file limit to what the
// connection caps need, as far as the hard limit allows; past that, lowers
// --http-max-connections to fit, saying so on stderr, so that accepting
// never runs out of descriptors (which would leave probes unanswered).
http::ServerOptions http_options_from_flags(const Flags& flags, const char* role);

}  // namespace lazykv
