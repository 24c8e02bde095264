#include "eval/progress.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

namespace lazykv::eval {

ProgressCallback progress_printer(const std::string& label, const std::function<void(const std::string&)>& log) {
  if (!log) return {};
  const auto start = std::chrono::steady_clock::now();
  auto next_report = std::make_shared<size_t>(0);
  return [=](size_t, const JobResult&, size_t done, size_t total) {
    if (done < *next_report && done != total) return;
    *next_report = done + std::max<size_t>(1, total / 20);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char line[256];
    std::snprintf(line, sizeof line, "%s: %zu/%zu jobs done, %.1f s", label.c_str(), done, total, elapsed);
    log(line);
  };
}

}  // namespace lazykv::eval
