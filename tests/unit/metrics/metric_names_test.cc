// The naming rules of metric_names.h, checked over every definition.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "common/metrics/metric_names.h"

namespace lazykv::metrics {
namespace {

bool is_snake_case(std::string_view s) {
  if (s.empty() || s.front() == '_' || s.back() == '_' || s.find("__") != std::string_view::npos) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return s.front() >= 'a' && s.front() <= 'z';
}

TEST(MetricNames, PrefixAndSnakeCase) {
  for (const MetricDef* def : kAllMetrics) {
    EXPECT_TRUE(def->name.starts_with("lazykv_")) << def->name;
    EXPECT_TRUE(is_snake_case(def->name)) << def->name;
  }
}

TEST(MetricNames, OnlyCountersEndInTotal) {
  for (const MetricDef* def : kAllMetrics) {
    bool total = def->name.ends_with("_total");
    EXPECT_EQ(total, def->type == MetricType::kCounter) << def->name;
  }
}

TEST(MetricNames, NoSuffixThatCollidesWithHistogramSeries) {
  // name_bucket/_sum/_count belong to histograms; a plain metric so named would clash.
  for (const MetricDef* def : kAllMetrics)
    for (std::string_view suffix : {"_bucket", "_sum", "_count"})
      EXPECT_FALSE(def->name.ends_with(suffix)) << def->name;
}

TEST(MetricNames, NoDuplicates) {
  std::set<std::string_view> names;
  for (const MetricDef* def : kAllMetrics) EXPECT_TRUE(names.insert(def->name).second) << def->name;
  // Histogram series names must not collide with another metric either.
  for (const MetricDef* def : kAllMetrics) {
    if (def->type != MetricType::kHistogram) continue;
    for (std::string_view suffix : {"_bucket", "_sum", "_count"})
      EXPECT_EQ(names.count(std::string(def->name) + std::string(suffix)), 0u) << def->name;
  }
}

TEST(MetricNames, HistogramBucketsStrictlyIncreasing) {
  for (const MetricDef* def : kAllMetrics) {
    if (def->type != MetricType::kHistogram) {
      EXPECT_TRUE(def->buckets.empty()) << def->name << ": only histograms have buckets";
      continue;
    }
    ASSERT_FALSE(def->buckets.empty()) << def->name;
    for (size_t i = 1; i < def->buckets.size(); ++i)
      EXPECT_LT(def->buckets[i - 1], def->buckets[i]) << def->name << " bucket " << i;
  }
}

TEST(MetricNames, LabelsAreSnakeCaseAndNeverLe) {
  for (const MetricDef* def : kAllMetrics) {
    std::set<std::string_view> seen;
    for (std::string_view label : def->label_names) {
      EXPECT_NE(label, "le") << def->name;
      EXPECT_TRUE(is_snake_case(label)) << def->name << " label '" << label << "'";
      EXPECT_FALSE(label.starts_with("__")) << def->name;
      EXPECT_TRUE(seen.insert(label).second) << def->name << " repeats label " << label;
    }
  }
}

TEST(MetricNames, EveryHelpIsNonEmpty) {
  for (const MetricDef* def : kAllMetrics) {
    EXPECT_FALSE(def->help.empty()) << def->name;
    EXPECT_EQ(def->help.find('\n'), std::string_view::npos) << def->name << ": keep help on one line";
  }
}

}  // namespace
}  // namespace lazykv::metrics
