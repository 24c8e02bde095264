#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/metrics/registry.h"

namespace lazykv::metrics {
namespace {

// The lines of one family in render(): from its "# HELP" up to the next family's.
std::string family_text(const std::string& rendered, std::string_view name) {
  std::string start = "# HELP " + std::string(name) + " ";
  size_t begin = rendered.find(start);
  if (begin == std::string::npos) return {};
  size_t end = rendered.find("# HELP ", begin + start.size());
  return rendered.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

TEST(Registry, RendersCounterExactly) {
  Registry registry;
  registry.counter(kPromptTokens).inc(3);
  registry.counter(kPromptTokens).inc(0.5);
  registry.counter(kPromptTokens).inc(-7);  // ignored: counters only go up
  EXPECT_EQ(family_text(registry.render(), kPromptTokens.name),
            "# HELP lazykv_prompt_tokens_total Prompt tokens admitted for prefill.\n"
            "# TYPE lazykv_prompt_tokens_total counter\n"
            "lazykv_prompt_tokens_total 3.5\n");
}

TEST(Registry, RendersLabelledGaugeSortedAndEscaped) {
  Registry registry;
  registry.gauge(kKvBytes, {"nvme"}).set(1e-7);
  registry.gauge(kKvBytes, {"device"}).set(4096);
  registry.gauge(kKvBytes, {"a\"b\\c\nd"}).add(0.1);
  registry.gauge(kKvBytes, {"host"}).set(-2);
  registry.gauge(kKvBytes, {"host"}).add(0.5);
  EXPECT_EQ(family_text(registry.render(), kKvBytes.name),
            "# HELP lazykv_kv_bytes Bytes of KV memory in use, by tier.\n"
            "# TYPE lazykv_kv_bytes gauge\n"
            "lazykv_kv_bytes{tier=\"a\\\"b\\\\c\\nd\"} 0.1\n"
            "lazykv_kv_bytes{tier=\"device\"} 4096\n"
            "lazykv_kv_bytes{tier=\"host\"} -1.5\n"
            "lazykv_kv_bytes{tier=\"nvme\"} 1e-07\n");
}

TEST(Registry, RendersHistogramWithLessOrEqualBuckets) {
  Registry registry;
  Histogram& h = registry.histogram(kStepBatchSize, {"0"});
  for (double v : {1.0, 2.0, 2.5, 256.0, 257.0, 0.0}) h.observe(v);
  EXPECT_EQ(family_text(registry.render(), kStepBatchSize.name),
            "# HELP lazykv_step_batch_size Sequences in one scheduler step.\n"
            "# TYPE lazykv_step_batch_size histogram\n"
            "lazykv_step_batch_size_bucket{worker=\"0\",le=\"1\"} 2\n"
            "lazykv_step_batch_size_bucket{worker=\"0\",le=\"2\"} 3\n"
            "lazykv_step_batch_size_bucket{worker=\"0\",le=\"4\"} 4\n"
            "lazykv_step_batch_size_bucket{worker=\"0\",le=\"8\"} 4\n"
            "lazykv_step_batch_size_bucket{worker=\"0\",le=\"16\"} 4\n"
            "lazykv_step_batch_size_bucket{worker=\"0\",le=\"32\"} 4\n"
            "lazykv_step_batch_size_bucket{worker=\"0\",le=\"64\"} 4\n"
            "lazykv_step_batch_size_bucket{worker=\"0\",le=\"128\"} 4\n"
            "lazykv_step_batch_size_bucket{worker=\"0\",le=\"256\"} 5\n"
            "lazykv_step_batch_size_bucket{worker=\"0\",le=\"+Inf\"} 6\n"
            "lazykv_step_batch_size_sum{worker=\"0\"} 518.5\n"
            "lazykv_step_batch_size_count{worker=\"0\"} 6\n");
}

TEST(Registry, UnlabelledHistogramHasFractionalBoundsAndStartsAtZero) {
  Registry registry;
  std::string untouched = family_text(registry.render(), kTimeToFirstToken.name);
  EXPECT_NE(untouched.find("lazykv_time_to_first_token_seconds_bucket{le=\"0.0025\"} 0\n"), std::string::npos);
  EXPECT_NE(untouched.find("lazykv_time_to_first_token_seconds_bucket{le=\"+Inf\"} 0\n"), std::string::npos);
  EXPECT_NE(untouched.find("lazykv_time_to_first_token_seconds_sum 0\n"), std::string::npos);
  EXPECT_NE(untouched.find("lazykv_time_to_first_token_seconds_count 0\n"), std::string::npos);

  registry.histogram(kTimeToFirstToken).observe(0.005);  // exactly on a bound: counted in le="0.005"
  std::string text = family_text(registry.render(), kTimeToFirstToken.name);
  EXPECT_NE(text.find("_bucket{le=\"0.0025\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("_bucket{le=\"0.005\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("_bucket{le=\"60\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("lazykv_time_to_first_token_seconds_sum 0.005\n"), std::string::npos) << text;
}

TEST(Registry, EmptyRegistryRendersEveryFamily) {
  Registry registry;
  std::string text = registry.render();
  size_t last = 0;
  for (const MetricDef* def : kAllMetrics) {
    size_t at = text.find("# HELP " + std::string(def->name) + " ");
    ASSERT_NE(at, std::string::npos) << def->name;
    EXPECT_GE(at, last) << def->name << " out of kAllMetrics order";
    last = at;
  }
  EXPECT_NE(text.find("\nlazykv_requests_running 0\n"), std::string::npos);
  EXPECT_NE(text.find("\nlazykv_evictions_total 0\n"), std::string::npos);
  // A labelled family with no series is only HELP and TYPE.
  EXPECT_EQ(family_text(text, kErrors.name),
            "# HELP lazykv_errors_total " + std::string(kErrors.help) + "\n# TYPE lazykv_errors_total counter\n");
}

TEST(Registry, SameLabelsGiveTheSameSeries) {
  Registry registry;
  Counter& a = registry.counter(kRequests, {"/v1/completions", "200"});
  for (int i = 0; i < 100; ++i) registry.counter(kRequests, {"/v1/x", std::to_string(i)}).inc();
  EXPECT_EQ(&a, &registry.counter(kRequests, {"/v1/completions", "200"}));
  EXPECT_NE(&a, &registry.counter(kRequests, {"/v1/completions", "400"}));
  EXPECT_EQ(&registry.gauge(kRequestsRunning), &registry.gauge(kRequestsRunning));
  EXPECT_EQ(&registry.histogram(kStepTokens, {"1"}), &registry.histogram(kStepTokens, {"1"}));
}

void expect_internal_error(const std::function<void()>& fn) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal) << e.what();
  }
}

TEST(Registry, RejectsTypeAndLabelMismatches) {
  Registry registry;
  expect_internal_error([&] { registry.counter(kRequestsRunning); });            // a gauge
  expect_internal_error([&] { registry.gauge(kRequests, {"/v1/models", "200"}); });  // a counter
  expect_internal_error([&] { registry.histogram(kPromptTokens); });
  expect_internal_error([&] { registry.counter(kEvictions, {"device"}); });       // takes no labels
  expect_internal_error([&] { registry.counter(kRequests, {"/v1/models"}); });    // takes two
  expect_internal_error([&] { registry.histogram(kStepDuration); });              // takes one
  expect_internal_error([&] { registry.gauge(kBuildInfo, {"a", "b", "c"}); });
}

TEST(Registry, RejectsDefinitionsOutsideMetricNames) {
  Registry registry;
  static constexpr MetricDef kStray{"lazykv_stray_total", MetricType::kCounter, "Not in kAllMetrics.",
                                    no_labels(), no_buckets()};
  static constexpr MetricDef kImpostor{"lazykv_prompt_tokens_total", MetricType::kCounter, "Different help.",
                                       no_labels(), no_buckets()};
  expect_internal_error([&] { registry.counter(kStray); });
  expect_internal_error([&] { registry.counter(kImpostor); });
  EXPECT_EQ(registry.render().find("lazykv_stray_total"), std::string::npos);
  MetricDef copy = kPromptTokens;  // an identical copy names the same metric
  registry.counter(copy).inc(2);
  EXPECT_EQ(registry.counter(kPromptTokens).value(), 2);
}

TEST(Registry, ConcurrentIncrementsAreExact) {
  Registry registry;
  constexpr int kThreads = 8, kIncrements = 100000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&registry, t] {
      Counter& shared = registry.counter(kRequests, {"/v1/chat/completions", "200"});
      Counter& own = registry.counter(kRequests, {"/v1/chat/completions", std::to_string(t)});
      Gauge& gauge = registry.gauge(kRequestsWaiting);
      for (int i = 0; i < kIncrements; ++i) {
        shared.inc();
        own.inc(2);
        gauge.add(i % 2 == 0 ? 1 : -0.5);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(registry.counter(kRequests, {"/v1/chat/completions", "200"}).value(), double(kThreads) * kIncrements);
  for (int t = 0; t < kThreads; ++t)
    EXPECT_EQ(registry.counter(kRequests, {"/v1/chat/completions", std::to_string(t)}).value(), 2.0 * kIncrements);
  EXPECT_EQ(registry.gauge(kRequestsWaiting).value(), kThreads * (kIncrements / 2) * 0.5);
}

TEST(Registry, ConcurrentObservationsAreExact) {
  Registry registry;
  constexpr int kThreads = 8, kObservations = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&registry] {
      Histogram& h = registry.histogram(kTransferDuration, {"host", "nvme"});
      for (int i = 0; i < kObservations; ++i) h.observe(i % 2 == 0 ? 0.25 : 2.0);  // binary-exact values
    });
  }
  // Render concurrently with the writers: must not crash or tear.
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(registry.render().empty());
  for (auto& th : threads) th.join();
  Histogram::Snapshot snap = registry.histogram(kTransferDuration, {"host", "nvme"}).snapshot();
  const uint64_t total = uint64_t(kThreads) * kObservations;
  EXPECT_EQ(snap.count, total);
  EXPECT_EQ(snap.sum, kThreads * (kObservations / 2) * (0.25 + 2.0));
  ASSERT_EQ(snap.cumulative.size(), std::size(kLatencyBuckets) + 1);
  for (size_t i = 0; i < std::size(kLatencyBuckets); ++i) {
    uint64_t expected = kLatencyBuckets[i] >= 2.0 ? total : kLatencyBuckets[i] >= 0.25 ? total / 2 : 0;
    EXPECT_EQ(snap.cumulative[i], expected) << "le=" << kLatencyBuckets[i];
  }
  EXPECT_EQ(snap.cumulative.back(), total);
}

TEST(Exposition, NumberSpelling) {
  EXPECT_EQ(format_number(3), "3");
  EXPECT_EQ(format_number(0), "0");
  EXPECT_EQ(format_number(-0.0), "0");
  EXPECT_EQ(format_number(-42), "-42");
  EXPECT_EQ(format_number(0.1), "0.1");
  EXPECT_EQ(format_number(2.5), "2.5");
  EXPECT_EQ(format_number(1.0 / 3.0), "0.3333333333333333");
  EXPECT_EQ(std::stod(format_number(1.0 / 3.0)), 1.0 / 3.0);
  EXPECT_EQ(format_number(123456789012), "123456789012");
  EXPECT_EQ(std::stod(format_number(1e300)), 1e300);
  EXPECT_EQ(format_number(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(format_number(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(format_number(std::nan("")), "NaN");
}

TEST(Exposition, Escaping) {
  EXPECT_EQ(escape_help("a\\b\nc\"d"), "a\\\\b\\nc\"d");
  EXPECT_EQ(escape_label_value("a\\b\nc\"d"), "a\\\\b\\nc\\\"d");
  EXPECT_EQ(escape_label_value("plain"), "plain");
}

TEST(Exposition, SpecialGaugeValues) {
  Registry registry;
  registry.gauge(kWorkerUp, {"0"}).set(std::numeric_limits<double>::infinity());
  registry.gauge(kWorkerUp, {"1"}).set(-std::numeric_limits<double>::infinity());
  registry.gauge(kWorkerUp, {"2"}).set(std::nan(""));
  std::string text = family_text(registry.render(), kWorkerUp.name);
  EXPECT_NE(text.find("lazykv_worker_up{worker=\"0\"} +Inf\n"), std::string::npos) << text;
  EXPECT_NE(text.find("lazykv_worker_up{worker=\"1\"} -Inf\n"), std::string::npos) << text;
  EXPECT_NE(text.find("lazykv_worker_up{worker=\"2\"} NaN\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace lazykv::metrics
