// lazykv replay-policy: one eviction policy over a JSON attention trace, no
// model needed (worker/policy/trace_replay.h); prints the result as JSON.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "common/bounded_json.h"
#include "common/error.h"
#include "common/flags.h"
#include "worker/policy/trace_replay.h"

namespace lazykv {

int run_replay_policy(const std::vector<std::string>& args) {
  Flags flags("replay-policy");
  flags.add("trace", "", "trace file (JSON; '-' reads stdin); format in docs/policies.md")
      .add("output", "", "write the result here instead of stdout");
  flags.parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  const std::string path = flags.get("trace");
  if (path.empty()) throw Error(ErrorCode::kInvalidArgument, "replay-policy: --trace is required");
  nlohmann::json trace;
  try {
    std::ostringstream text;
    if (path == "-") {
      text << std::cin.rdbuf();
    } else {
      std::ifstream in(path);
      if (!in) throw Error(ErrorCode::kNotFound, "replay-policy: cannot open " + path);
      text << in.rdbuf();
    }
    trace = parse_bounded_json(text.str());
  } catch (const JsonLimitError& e) {
    throw Error(ErrorCode::kInvalidArgument, "replay-policy: " + path + ": " + e.what());
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(ErrorCode::kInvalidArgument, "replay-policy: " + path + " is not valid JSON: " + e.what());
  }
  const std::string text = replay_trace(trace).dump() + "\n";
  if (flags.get("output").empty()) {
    std::fputs(text.c_str(), stdout);
  } else {
    std::ofstream out(flags.get("output"));
    out << text;
    if (!out) throw Error(ErrorCode::kIo, "replay-policy: cannot write " + flags.get("output"));
  }
  return 0;
}

}  // namespace lazykv
