#include "common/metrics/registry.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "common/error.h"

namespace lazykv::metrics {
namespace {

// Lock-free add for atomic doubles (a CAS loop keeps it portable and exact
// under contention: every add lands once).
void atomic_add(std::atomic<double>& target, double v) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + v, std::memory_order_relaxed)) {
  }
}

std::string_view type_name(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "untyped";
}

std::string escape(std::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (quote && c == '"') out += "\\\"";
    else out += c;
  }
  return out;
}

// `{a="x",b="y"` plus an optional extra pair (the histogram's le), closed; empty when no labels.
std::string label_text(const MetricDef& def, const LabelValues& values, std::string_view le = {}) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    out += out.empty() ? "{" : ",";
    out.append(def.label_names[i]).append("=\"").append(escape_label_value(values[i])).append("\"");
  }
  if (!le.empty()) out.append(out.empty() ? "{" : ",").append("le=\"").append(le).append("\"");
  if (!out.empty()) out += "}";
  return out;
}

bool same_def(const MetricDef& a, const MetricDef& b) {
  return a.name == b.name && a.type == b.type && a.help == b.help &&
         std::equal(a.label_names.begin(), a.label_names.end(), b.label_names.begin(), b.label_names.end()) &&
         std::equal(a.buckets.begin(), a.buckets.end(), b.buckets.begin(), b.buckets.end());
}

}  // namespace

std::string format_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Exact integers below 1e15 print plainly (3, not 3e+00); larger ones keep to_chars' spelling.
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round-trip
  (void)ec;  // 64 bytes always suffice for a double
  return std::string(buf, end);
}

std::string escape_help(std::string_view text) { return escape(text, false); }
std::string escape_label_value(std::string_view text) { return escape(text, true); }

void Counter::inc(double v) {
  if (!(v >= 0)) return;  // also drops NaN: a counter never goes down or becomes NaN
  atomic_add(value_, v);
}

void Gauge::add(double v) { atomic_add(value_, v); }

Histogram::Histogram(std::span<const double> upper_bounds)
    : bounds_(upper_bounds.begin(), upper_bounds.end()), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  // Buckets are "less or equal": the first bound >= v; NaN falls in +Inf.
  size_t bucket = std::isnan(v) ? bounds_.size()
                                : static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) -
                                                      bounds_.begin());
  std::lock_guard lock(mutex_);
  ++counts_[bucket];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot snap;
  std::lock_guard lock(mutex_);
  snap.cumulative.resize(counts_.size());
  uint64_t running = 0;
  for (size_t i = 0; i < counts_.size(); ++i) snap.cumulative[i] = running += counts_[i];
  snap.sum = sum_;
  snap.count = count_;
  return snap;
}

struct Registry::Family {
  const MetricDef* def;
  std::map<LabelValues, std::unique_ptr<Counter>> counters;
  std::map<LabelValues, std::unique_ptr<Gauge>> gauges;
  std::map<LabelValues, std::unique_ptr<Histogram>> histograms;
};

namespace {

template <typename Series, typename Make>
Series& find_or_create(std::map<LabelValues, std::unique_ptr<Series>>& series, const LabelValues& labels,
                       Make make) {
  auto it = series.find(labels);
  if (it == series.end()) it = series.emplace(labels, make()).first;
  return *it->second;
}

void check_labels(const MetricDef& def, const LabelValues& labels) {
  if (labels.size() != def.label_names.size())
    throw Error(ErrorCode::kInternal, "metric " + std::string(def.name) + " takes " +
                                          std::to_string(def.label_names.size()) + " label values, got " +
                                          std::to_string(labels.size()));
}

}  // namespace

Registry::Registry() {
  for (const MetricDef* def : kAllMetrics) {
    auto family = std::make_unique<Family>();
    family->def = def;
    // Unlabelled series exist from the start, so they are exported as 0.
    if (def->label_names.empty()) {
      switch (def->type) {
        case MetricType::kCounter: family->counters.emplace(LabelValues{}, std::make_unique<Counter>()); break;
        case MetricType::kGauge: family->gauges.emplace(LabelValues{}, std::make_unique<Gauge>()); break;
        case MetricType::kHistogram:
          family->histograms.emplace(LabelValues{}, std::make_unique<Histogram>(def->buckets));
          break;
      }
    }
    families_.emplace(def->name, std::move(family));
  }
}

Registry::~Registry() = default;

Registry::Family& Registry::family(const MetricDef& def, MetricType type) {
  auto it = families_.find(def.name);
  if (it == families_.end() || !same_def(*it->second->def, def))
    throw Error(ErrorCode::kInternal, "metric " + std::string(def.name) + " is not defined in metric_names.h");
  if (def.type != type)
    throw Error(ErrorCode::kInternal, "metric " + std::string(def.name) + " is a " +
                                          std::string(type_name(def.type)) + ", used as a " +
                                          std::string(type_name(type)));
  return *it->second;
}

Counter& Registry::counter(const MetricDef& def, const LabelValues& labels) {
  std::lock_guard lock(mutex_);
  Family& f = family(def, MetricType::kCounter);
  check_labels(def, labels);
  return find_or_create(f.counters, labels, [] { return std::make_unique<Counter>(); });
}

Gauge& Registry::gauge(const MetricDef& def, const LabelValues& labels) {
  std::lock_guard lock(mutex_);
  Family& f = family(def, MetricType::kGauge);
  check_labels(def, labels);
  return find_or_create(f.gauges, labels, [] { return std::make_unique<Gauge>(); });
}

Histogram& Registry::histogram(const MetricDef& def, const LabelValues& labels) {
  std::lock_guard lock(mutex_);
  Family& f = family(def, MetricType::kHistogram);
  check_labels(def, labels);
  return find_or_create(f.histograms, labels, [&] { return std::make_unique<Histogram>(def.buckets); });
}

std::string Registry::render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (const MetricDef* def : kAllMetrics) {
    const Family& f = *families_.at(std::string(def->name));
    const std::string name(def->name);
    out += "# HELP " + name + " " + escape_help(def->help) + "\n";
    out += "# TYPE " + name + " " + std::string(type_name(def->type)) + "\n";
    for (const auto& [labels, c] : f.counters)
      out += name + label_text(*def, labels) + " " + format_number(c->value()) + "\n";
    for (const auto& [labels, g] : f.gauges)
      out += name + label_text(*def, labels) + " " + format_number(g->value()) + "\n";
    for (const auto& [labels, h] : f.histograms) {
      Histogram::Snapshot snap = h->snapshot();
      std::span<const double> bounds = h->upper_bounds();
      for (size_t i = 0; i < snap.cumulative.size(); ++i) {
        std::string le = i < bounds.size() ? format_number(bounds[i]) : "+Inf";
        out += name + "_bucket" + label_text(*def, labels, le) + " " + std::to_string(snap.cumulative[i]) +
               "\n";
      }
      out += name + "_sum" + label_text(*def, labels) + " " + format_number(snap.sum) + "\n";
      out += name + "_count" + label_text(*def, labels) + " " + std::to_string(snap.count) + "\n";
    }
  }
  return out;
}

}  // namespace lazykv::metrics
