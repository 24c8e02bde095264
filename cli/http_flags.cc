#include "cli/http_flags.h"

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "common/error.h"

namespace lazykv {
namespace {

// Descriptors kept for everything but client connections: the model files,
// gRPC, workers, the kvstore, logs; and the refusals the server writes.
constexpr int64_t kReservedFiles = 512;

std::chrono::milliseconds seconds_flag(const Flags& flags, const std::string& name) {
  const double seconds = flags.get_double(name);
  if (!(seconds > 0 && seconds <= 86400)) {
    throw Error(ErrorCode::kInvalidArgument, "--" + name + " must be in (0, 86400] seconds");
  }
  return std::chrono::milliseconds(std::max<int64_t>(1, int64_t(seconds * 1000)));
}

// The open-file limit raised towards `wanted`; returns the soft limit after.
int64_t raise_file_limit(int64_t wanted) {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0) return wanted;
  if (files.rlim_cur != RLIM_INFINITY && int64_t(files.rlim_cur) < wanted) {
    files.rlim_cur = files.rlim_max == RLIM_INFINITY ? rlim_t(wanted) : std::min<rlim_t>(files.rlim_max, wanted);
    ::setrlimit(RLIMIT_NOFILE, &files);
    ::getrlimit(RLIMIT_NOFILE, &files);
  }
  return files.rlim_cur == RLIM_INFINITY ? wanted : int64_t(files.rlim_cur);
}

}  // namespace

void add_http_flags(Flags& flags) {
  const http::ServerOptions d;
  const auto seconds = [](std::chrono::milliseconds ms) { return std::to_string(ms.count() / 1000); };
  flags.add("max-body-bytes", std::to_string(d.max_body_bytes), "largest request body; larger ones get 413")
      .add("http-max-connections", std::to_string(d.max_connections),
           "open HTTP connections; beyond it new ones get 503 (each idle one costs memory, not a thread)")
      .add("http-max-connections-per-address", std::to_string(d.max_connections_per_address),
           "open HTTP connections from one client address; 0: no limit (behind a proxy every client shares one)")
      .add("http-probe-slots", std::to_string(d.probe_slots),
           "connections taken past the caps for /health and /ready alone, so probes pass a flood")
      .add("http-header-timeout-seconds", seconds(d.header_timeout),
           "the whole request line and headers must arrive within this; else 408")
      .add("http-body-timeout-seconds", seconds(d.body_timeout),
           "the body must arrive within this plus 1 s per --http-min-body-rate bytes; else 408")
      .add("http-min-body-rate", std::to_string(d.min_body_rate),
           "bytes per second a body must keep up after --http-body-timeout-seconds; 0: the timeout is for the whole body")
      .add("http-keep-alive-seconds", seconds(d.keep_alive_timeout), "an idle keep-alive connection is closed after this")
      .add("http-write-timeout-seconds", seconds(d.write_timeout),
           "a response write the client does not take in within this ends the request")
      .add("http-max-body-memory-mib", std::to_string(d.max_body_memory >> 20),
           "request bodies being read or handled, all together; past it new bodies get 503")
      .add("http-io-threads", std::to_string(d.io_threads), "threads reading requests and writing the server's own answers")
      .add("http-handler-threads", std::to_string(d.handler_threads),
           "requests handled at once (generation streams from these); more wait for a thread");
}

http::ServerOptions http_options_from_flags(const Flags& flags, const char* role) {
  http::ServerOptions options;
  options.host = flags.get("host");
  options.port = uint16_t(flags.get_int_in("port", 0, 65535));
  options.max_body_bytes = size_t(flags.get_int_in("max-body-bytes", 1, int64_t(1) << 40));
  options.max_connections = int(flags.get_int_in("http-max-connections", 1, 10'000'000));
  options.max_connections_per_address = int(flags.get_int_in("http-max-connections-per-address", 0, 10'000'000));
  options.probe_slots = int(flags.get_int_in("http-probe-slots", 0, 100'000));
  options.header_timeout = seconds_flag(flags, "http-header-timeout-seconds");
  options.body_timeout = seconds_flag(flags, "http-body-timeout-seconds");
  options.min_body_rate = size_t(flags.get_int_in("http-min-body-rate", 0, int64_t(1) << 40));
  options.keep_alive_timeout = seconds_flag(flags, "http-keep-alive-seconds");
  options.write_timeout = seconds_flag(flags, "http-write-timeout-seconds");
  options.max_body_memory = size_t(flags.get_int_in("http-max-body-memory-mib", 1, int64_t(1) << 30)) << 20;
  if (options.max_body_memory < options.max_body_bytes) {
    throw Error(ErrorCode::kInvalidArgument, "--http-max-body-memory-mib must hold at least one --max-body-bytes body");
  }
  options.io_threads = int(flags.get_int_in("http-io-threads", 1, 256));
  options.handler_threads = int(flags.get_int_in("http-handler-threads", 1, 100'000));

  const int64_t wanted = int64_t(options.max_connections) + options.probe_slots + kReservedFiles;
  const int64_t limit = raise_file_limit(wanted);
  if (limit < wanted) {
    const int64_t fits = std::max<int64_t>(1, limit - options.probe_slots - kReservedFiles);
    std::fprintf(stderr,
                 "lazykv %s: the open-file limit is %lld (hard limit reached), too few for "
                 "--http-max-connections %d; taking at most %lld connections (raise `ulimit -n` for more)\n",
                 role, static_cast<long long>(limit), options.max_connections, static_cast<long long>(fits));
    options.max_connections = int(fits);
  }
  return options;
}

}  // namespace lazykv
