// Step plans that tests build often.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/step_executor.h"

namespace lazykv {

// Starts sequence `seq` on `prompt`: the whole prompt is the step's one item.
inline StepPlan plan_starting(SeqId seq, std::vector<int32_t> prompt, PolicyConfig policy = {}) {
  StepPlan plan;
  SequenceStart start;
  start.seq = seq;
  start.prompt = std::move(prompt);
  start.policy = std::move(policy);
  plan.items = {{seq, int32_t(start.prompt.size()), {}}};
  plan.start = {std::move(start)};
  return plan;
}

}  // namespace lazykv
