#include "eval/episodes.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "common/error.h"

namespace lazykv::eval {
namespace {

using Matrix = std::vector<std::vector<float>>;
using Points = std::span<const std::vector<float>>;  // one row per segment
using Engine = std::mt19937_64;

constexpr int kMaxLloydIterations = 100;

// Calls on_bucket(bucket) for every word of text, in order.
template <typename OnBucket>
void for_each_word_bucket(std::string_view text, OnBucket&& on_bucket) {
  constexpr uint64_t kFnvOffset = 14695981039346656037ull;
  constexpr uint64_t kFnvPrime = 1099511628211ull;
  uint64_t hash = kFnvOffset;
  bool in_word = false;
  for (size_t i = 0; i <= text.size(); ++i) {  // i == size: a separator ending the last word
    const char c = i < text.size() ? text[i] : ' ';
    const bool upper = c >= 'A' && c <= 'Z';
    if (upper || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
      hash = (hash ^ uint8_t(upper ? c - 'A' + 'a' : c)) * kFnvPrime;
      in_word = true;
      continue;
    }
    if (in_word) on_bucket(int(hash % kEmbeddingDims));
    hash = kFnvOffset;
    in_word = false;
  }
}

// Draws from the engine's raw output rather than std distributions, whose
// algorithms differ between standard libraries: same seed, same episodes.
double uniform01(Engine& engine) { return double(engine() >> 11) * 0x1.0p-53; }
size_t uniform_index(Engine& engine, size_t n) { return size_t(engine() % n); }

// The i < n of the highest score(i) (ties: the lower index).
template <typename Score>
int argmax(size_t n, Score&& score) {
  int best = 0;
  double best_score = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < n; ++i) {
    const double s = score(i);
    if (s > best_score) best_score = s, best = int(i);
  }
  return best;
}

double squared_distance(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t d = 0; d < a.size(); ++d) sum += (double(a[d]) - b[d]) * (double(a[d]) - b[d]);
  return sum;
}

double dot(std::span<const float> a, std::span<const float> b) {
  double sum = 0;
  for (size_t d = 0; d < a.size(); ++d) sum += double(a[d]) * b[d];
  return sum;
}

// 0 when either vector is all zeros (a segment without words).
double cosine(std::span<const float> a, std::span<const float> b) {
  const double norms = dot(a, a) * dot(b, b);
  return norms == 0 ? 0 : dot(a, b) / std::sqrt(norms);
}

// k-means++: the first centre uniformly, each next one with probability
// proportional to the squared distance to the nearest centre chosen so far.
Matrix kmeans_plus_plus(Points points, int k, Engine& engine) {
  Matrix centroids = {points[uniform_index(engine, points.size())]};
  std::vector<double> nearest(points.size(), std::numeric_limits<double>::infinity());
  while (int(centroids.size()) < k) {
    double total = 0;
    for (size_t i = 0; i < points.size(); ++i) {
      nearest[i] = std::min(nearest[i], squared_distance(points[i], centroids.back()));
      total += nearest[i];
    }
    size_t chosen = 0;
    if (total == 0) {
      chosen = uniform_index(engine, points.size());  // every point is a centre already (duplicates)
    } else {
      const double target = uniform01(engine) * total;
      double cumulative = 0;
      for (size_t i = 0; i < points.size(); ++i) {
        if (nearest[i] == 0) continue;
        chosen = i;  // the last positive one absorbs rounding at the end
        cumulative += nearest[i];
        if (cumulative > target) break;
      }
    }
    centroids.push_back(points[chosen]);
  }
  return centroids;
}

// Each point to its nearest centroid (ties: the lower index); then each
// empty cluster gets the point farthest from its centroid, taken from a
// cluster that keeps at least one point (one always exists: k <= n).
std::vector<int> assign_to_centroids(Points points, const Matrix& centroids) {
  std::vector<int> assignment(points.size());
  for (size_t i = 0; i < points.size(); ++i) {
    assignment[i] = argmax(centroids.size(), [&](size_t c) { return -squared_distance(points[i], centroids[c]); });
  }
  std::vector<int> sizes(centroids.size(), 0);
  for (int cluster : assignment) ++sizes[cluster];
  for (size_t empty = 0; empty < centroids.size(); ++empty) {
    if (sizes[empty] > 0) continue;
    const int farthest = argmax(points.size(), [&](size_t i) {
      if (sizes[assignment[i]] < 2) return -1.0;  // its cluster would empty
      return squared_distance(points[i], centroids[assignment[i]]);
    });
    --sizes[assignment[farthest]];
    assignment[farthest] = int(empty);
    sizes[empty] = 1;
  }
  return assignment;
}

Matrix cluster_means(Points points, const std::vector<int>& assignment, int k) {
  const size_t dims = points[0].size();
  std::vector<std::vector<double>> sums(k, std::vector<double>(dims, 0));
  std::vector<int> sizes(k, 0);
  for (size_t i = 0; i < points.size(); ++i) {
    ++sizes[assignment[i]];
    for (size_t d = 0; d < dims; ++d) sums[assignment[i]][d] += points[i][d];
  }
  Matrix means(k, std::vector<float>(dims));
  for (int c = 0; c < k; ++c) {
    for (size_t d = 0; d < dims; ++d) means[c][d] = float(sums[c][d] / sizes[c]);
  }
  return means;
}

struct Partition {
  Matrix centroids;
  std::vector<int> assignment;
  double inertia = 0;
};

// Lloyd's iterations from the given centres. On return the centroids are the
// means of the assignment and no cluster is empty.
Partition lloyd(Points points, Matrix centroids) {
  const int k = int(centroids.size());
  Partition partition;
  for (int iteration = 0; iteration < kMaxLloydIterations; ++iteration) {
    std::vector<int> next = assign_to_centroids(points, centroids);
    if (next == partition.assignment) break;
    partition.assignment = std::move(next);
    centroids = cluster_means(points, partition.assignment, k);
  }
  partition.centroids = std::move(centroids);
  for (size_t i = 0; i < points.size(); ++i) {
    partition.inertia += squared_distance(points[i], partition.centroids[partition.assignment[i]]);
  }
  return partition;
}

// The `count` points most cosine-similar to centroid (ties: lower index),
// in ascending index order.
std::vector<int> medoids_of(Points points, const std::vector<float>& centroid, size_t count) {
  std::vector<std::pair<double, int>> ranked;  // (-similarity, index): ascending is best first
  for (size_t i = 0; i < points.size(); ++i) ranked.emplace_back(-cosine(points[i], centroid), int(i));
  std::partial_sort(ranked.begin(), ranked.begin() + count, ranked.end());
  std::vector<int> medoids;
  for (size_t i = 0; i < count; ++i) medoids.push_back(ranked[i].second);
  std::sort(medoids.begin(), medoids.end());
  return medoids;
}

void check_cluster_arguments(Points embeddings, const EpisodeOptions& options) {
  auto refuse = [](const std::string& what) {
    throw Error(ErrorCode::kInvalidArgument, "eval::cluster_episodes: " + what);
  };
  for (const auto& [name, value] :
       {std::pair{"episodes", options.episodes}, {"medoids", options.medoids}, {"restarts", options.restarts}}) {
    if (value < 1) refuse(std::string(name) + " must be >= 1 (" + std::to_string(value) + ")");
  }
  if (embeddings.empty()) refuse("no segments to cluster");
  for (size_t i = 1; i < embeddings.size(); ++i) {
    if (embeddings[i].size() == embeddings[0].size()) continue;
    refuse("segment " + std::to_string(i) + " has " + std::to_string(embeddings[i].size()) +
           " dims, segment 0 has " + std::to_string(embeddings[0].size()));
  }
}

}  // namespace

TextEmbedder::TextEmbedder(std::span<const std::string> texts) : idf_(kEmbeddingDims) {
  std::vector<int> document_frequency(kEmbeddingDims, 0);
  for (const std::string& text : texts) {
    std::set<int> buckets;
    for_each_word_bucket(text, [&](int bucket) { buckets.insert(bucket); });
    for (int bucket : buckets) ++document_frequency[bucket];
  }
  const double n = double(texts.size());
  for (int b = 0; b < kEmbeddingDims; ++b) idf_[b] = std::log((1 + n) / (1 + document_frequency[b])) + 1;
}

std::vector<float> TextEmbedder::embed(std::string_view text) const {
  std::vector<double> weights(kEmbeddingDims, 0);
  for_each_word_bucket(text, [&](int bucket) { weights[bucket] += idf_[bucket]; });
  double norm = 0;
  for (double w : weights) norm += w * w;
  norm = std::sqrt(norm);
  std::vector<float> embedding(kEmbeddingDims, 0.0f);
  for (int b = 0; norm > 0 && b < kEmbeddingDims; ++b) embedding[b] = float(weights[b] / norm);
  return embedding;
}

Episodes cluster_episodes(std::span<const std::vector<float>> embeddings, const EpisodeOptions& options) {
  check_cluster_arguments(embeddings, options);
  const int k = std::min<int>(options.episodes, int(embeddings.size()));
  Engine engine(options.seed);
  Partition best;
  for (int restart = 0; restart < options.restarts; ++restart) {
    Partition candidate = lloyd(embeddings, kmeans_plus_plus(embeddings, k, engine));
    if (restart == 0 || candidate.inertia < best.inertia) best = std::move(candidate);
  }
  Episodes episodes{std::move(best.centroids), {}, std::move(best.assignment)};
  const size_t medoids = std::min<size_t>(options.medoids, embeddings.size());
  for (const std::vector<float>& centroid : episodes.centroids) {
    episodes.members.push_back(medoids_of(embeddings, centroid, medoids));
  }
  return episodes;
}

int route(const Episodes& episodes, std::span<const float> query) {
  if (episodes.centroids.empty()) throw Error(ErrorCode::kInvalidArgument, "eval::route: no episodes");
  if (query.size() != episodes.centroids[0].size()) {
    throw Error(ErrorCode::kInvalidArgument, "eval::route: query has " + std::to_string(query.size()) +
                                                 " dims, centroids " + std::to_string(episodes.centroids[0].size()));
  }
  return argmax(episodes.centroids.size(), [&](size_t e) { return cosine(query, episodes.centroids[e]); });
}

}  // namespace lazykv::eval
