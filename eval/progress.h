// Progress lines for long evaluation runs ("label: 12/40 jobs done, 3.1 s").
#pragma once

#include <functional>
#include <string>

#include "eval/batch_runner.h"

namespace lazykv::eval {

// A ProgressCallback that sends a line to log about every 5% of the jobs (and
// at the end); nothing when log is empty.
ProgressCallback progress_printer(const std::string& label, const std::function<void(const std::string&)>& log);

}  // namespace lazykv::eval
