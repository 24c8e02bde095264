// Runs `promtool check metrics` (Prometheus' own parser and linter) over
// render(): a fully populated registry and an empty one.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "common/metrics/registry.h"

namespace lazykv::metrics {
namespace {

constexpr const char* kPromtool = "/usr/bin/promtool";

struct PromtoolResult {
  int exit_status = -1;
  std::string output;  // stdout and stderr: lint problems, parse errors
};

PromtoolResult promtool_check(const std::string& exposition) {
  std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("lazykv_metrics_" + std::to_string(getpid()) + ".prom");
  std::ofstream(file, std::ios::binary) << exposition;
  std::string command = std::string(kPromtool) + " check metrics < " + file.string() + " 2>&1";
  PromtoolResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) result.output.append(buf, n);
  int status = pclose(pipe);
  result.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::filesystem::remove(file);
  return result;
}

#define SKIP_WITHOUT_PROMTOOL()                                                                          \
  if (!std::filesystem::exists(kPromtool))                                                               \
  GTEST_SKIP() << kPromtool << " not found: setup installs Debian's prometheus package (CI has it)"

// A series for every metric, with realistic label values: series i takes
// value i (cycling) of each of its labels; the first label sets the count.
void populate(Registry& registry) {
  const std::map<std::string_view, std::vector<std::string>> values_for = {
      {"tier", {"device", "host", "nvme"}},
      {"src_tier", {"device", "host"}},
      {"dst_tier", {"host", "nvme"}},
      {"worker", {"0", "1"}},
      {"type", {"invalid_request", "overloaded"}},
      {"endpoint", {"/v1/chat/completions", "/v1/completions"}},
      {"code", {"200", "400"}},
      {"version", {"0.1.0"}},
      {"model", {"SmolLM2-135M-Instruct"}},
      {"transport", {"tcp", "shm"}},
      {"phase", {"thinking", "answer"}},
      {"replica", {"10.0.0.7:8000", "10.0.0.8:8000"}},
  };
  for (const MetricDef* def : kAllMetrics) {
    std::vector<LabelValues> series = {{}};
    if (!def->label_names.empty()) {
      series.assign(values_for.at(def->label_names.front()).size(), {});
      for (size_t i = 0; i < series.size(); ++i) {
        for (std::string_view name : def->label_names) {
          const std::vector<std::string>& values = values_for.at(name);
          series[i].push_back(values[i % values.size()]);
        }
      }
    }
    for (const LabelValues& labels : series) {
      switch (def->type) {
        case MetricType::kCounter: registry.counter(*def, labels).inc(3); break;
        case MetricType::kGauge: registry.gauge(*def, labels).set(1); break;
        case MetricType::kHistogram:
          registry.histogram(*def, labels).observe(0.3);
          registry.histogram(*def, labels).observe(def->buckets.front());
          break;
      }
    }
  }
}

TEST(Promtool, DetectsALintProblem) {
  // The harness itself: a counter without _total must be reported.
  SKIP_WITHOUT_PROMTOOL();
  PromtoolResult bad = promtool_check("# HELP bad_counter A counter.\n# TYPE bad_counter counter\nbad_counter 1\n");
  EXPECT_NE(bad.output.find("bad_counter"), std::string::npos) << bad.output;
  EXPECT_NE(bad.exit_status, 0);
}

TEST(Promtool, AcceptsAFullyPopulatedRegistry) {
  SKIP_WITHOUT_PROMTOOL();
  Registry registry;
  populate(registry);
  std::string text = registry.render();
  for (const MetricDef* def : kAllMetrics) {
    std::string sample = "\n";  // a sample line, not the HELP/TYPE comment
    sample.append(def->name).append(def->type == MetricType::kHistogram ? "_count" : "");
    EXPECT_NE(text.find(sample), std::string::npos) << def->name << " has no series";
  }
  PromtoolResult result = promtool_check(text);
  EXPECT_EQ(result.exit_status, 0) << result.output << "\n--- input ---\n" << text;
  EXPECT_EQ(result.output, "") << "promtool reported lint problems";
}

TEST(Promtool, AcceptsAnEmptyRegistry) {
  SKIP_WITHOUT_PROMTOOL();
  Registry registry;
  std::string text = registry.render();
  PromtoolResult result = promtool_check(text);
  EXPECT_EQ(result.exit_status, 0) << result.output << "\n--- input ---\n" << text;
  EXPECT_EQ(result.output, "") << "promtool reported lint problems";
}

}  // namespace
}  // namespace lazykv::metrics
