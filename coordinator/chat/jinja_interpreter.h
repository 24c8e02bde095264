// Evaluates a parsed template against a context of variables.
#pragma once

#include <string>

#include "coordinator/chat/jinja_ast.h"

namespace lazykv::jinja {

// Bounds that keep a hostile template from exhausting the process.
constexpr size_t kMaxOutputBytes = size_t{64} << 20;
constexpr int kMaxEvalDepth = 500;          // nested evaluation, including macro recursion
constexpr uint64_t kMaxSteps = 2'000'000;   // statements and loop iterations per render
// Work inside expressions per render: one unit per node evaluated, plus the
// items of every list and 64 bytes of every string that a call, filter,
// operator, index or slice produces (range(1000000) in a loop of 900000 would
// otherwise run for hours within the step budget).
constexpr uint64_t kMaxWork = 10'000'000;

// Throws Error(kInvalidArgument) for a runtime error or raise_exception().
std::string render(const Body& program, const Json& context);

}  // namespace lazykv::jinja
