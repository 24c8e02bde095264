// Prometheus metrics: counters, gauges and histograms with labels, rendered
// in the text exposition format (0.0.4). Every metric is defined once in
// metric_names.h; the registry only accepts those definitions, so a name can
// never be mistyped at a call site. Thread-safe; the returned references stay
// valid for the registry's lifetime, so hot paths look a series up once.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/metrics/metric_names.h"

namespace lazykv::metrics {

// Label values, in the order of the definition's label names.
using LabelValues = std::vector<std::string>;

class Counter {
 public:
  void inc(double v = 1.0);  // v >= 0 (negative values are ignored)
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double v);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// One contributor's part of a gauge that several add up to (the schedulers
// of a coordinator's groups on one registry): set() moves the gauge by the
// change in this part. One writer per share.
class GaugeShare {
 public:
  explicit GaugeShare(Gauge& gauge) : gauge_(&gauge) {}
  void set(double v) {
    gauge_->add(v - value_);
    value_ = v;
  }

 private:
  Gauge* gauge_;
  double value_ = 0;
};

class Histogram {
 public:
  explicit Histogram(std::span<const double> upper_bounds);
  void observe(double v);
  // Cumulative counts per bucket (the last is +Inf), sum and count, read consistently.
  struct Snapshot {
    std::vector<uint64_t> cumulative;
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;
  std::span<const double> upper_bounds() const { return bounds_; }

 private:
  std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Registry {
 public:
  Registry();
  ~Registry();

  // The series of `def` with these label values, created on first use.
  // Throws Error(kInternal) if the def's type differs or the number of label
  // values does not match its label names.
  Counter& counter(const MetricDef& def, const LabelValues& labels = {});
  Gauge& gauge(const MetricDef& def, const LabelValues& labels = {});
  Histogram& histogram(const MetricDef& def, const LabelValues& labels = {});

  // Every metric of kAllMetrics in order (HELP and TYPE even with no series;
  // unlabelled ones are always present, 0 until touched), series sorted by
  // label values, served with kContentType.
  std::string render() const;
  static constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

 private:
  struct Family;
  Family& family(const MetricDef& def, MetricType type);
  mutable std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Family>, std::less<>> families_;
};

// Exposition-format spelling, shared by render() (exposed for tests):
// integers without a decimal point, otherwise the shortest round-trip text;
// +Inf, -Inf, NaN as Prometheus spells them.
std::string format_number(double v);
// HELP text escapes backslash and newline; label values also the double quote.
std::string escape_help(std::string_view text);
std::string escape_label_value(std::string_view text);

}  // namespace lazykv::metrics
