// Drives one eviction policy from a recorded attention trace, without a
// model: one layer, one query head per KV head, probabilities
// softmax(q . k / sqrt(D)) over the cached keys after the step's key is
// appended. For golden tests and for studying policies
// (`lazykv replay-policy`). Trace format in docs/policies.md.
#pragma once

#include <nlohmann/json_fwd.hpp>

namespace lazykv {

// Returns {"policy": {...}, "prompt_len": P, "peak_slots": ..., "steps":
// [{"t": t, "kept": [[positions] per head], "state": [{per-slot arrays} per head]}]}.
// Throws Error(kInvalidArgument) naming the first malformed field.
nlohmann::json replay_trace(const nlohmann::json& trace);

}  // namespace lazykv
