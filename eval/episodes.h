// EpiCache's offline episode clustering (arXiv 2509.17396): a long
// conversation's segments are embedded, grouped by K-means into episodes, and
// each episode is represented by its centroid and by the few segments closest
// to it (its medoids, the prompt EpiCache compresses the cache against). A
// later question is routed to the episode whose centroid it is closest to.
// The paper embeds with a sentence encoder; lazykv ships none, so segments
// are embedded lexically (hashed TF-IDF), which separates topics by the words
// they use. Pure text and arithmetic: no model, no tokenizer.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lazykv::eval {

// Hash buckets of a TextEmbedder vector.
inline constexpr int kEmbeddingDims = 4096;

// Hashed TF-IDF over words (maximal runs of ASCII letters and digits,
// lowercased), each word hashed by FNV-1a 64 into kEmbeddingDims buckets.
// A bucket's weight in a text is tf (its word count in the text) times
// idf = ln((1 + N) / (1 + df)) + 1, the smooth idf of scikit-learn, where N is
// the number of texts the embedder was built from and df the number of them
// holding a word of that bucket. Texts outside the build set (a question)
// use the same idf; a bucket unseen at build time has df = 0.
class TextEmbedder {
 public:
  explicit TextEmbedder(std::span<const std::string> texts);

  // kEmbeddingDims values, L2-normalised; all zeros when text has no words.
  std::vector<float> embed(std::string_view text) const;

 private:
  std::vector<double> idf_;  // per bucket
};

struct EpisodeOptions {
  int episodes = 4;   // K of K-means; capped at the number of segments
  int medoids = 2;    // segments kept per episode; capped likewise
  int restarts = 10;  // k-means++ initialisations; the lowest inertia wins
  uint64_t seed = 42;
};

struct Episodes {
  std::vector<std::vector<float>> centroids;  // [episode][dims]
  // Per episode: its `medoids` segments most cosine-similar to the centroid,
  // chosen among ALL segments (as EpiCache does), ascending (chronological).
  std::vector<std::vector<int>> members;
  std::vector<int> assignment;  // per segment: its episode
};

// K-means (Euclidean, as scikit-learn's KMeans) over the rows of embeddings:
// k-means++ initialisation from one std::mt19937_64 seeded with options.seed
// and shared by all restarts (so a run is reproducible), Lloyd iterations
// until the assignment stops changing (at most 100), the restart of lowest
// inertia kept (ties: the earlier). An empty cluster is reseeded with the
// point farthest from its centroid. Every episode has at least one segment.
// Error(kInvalidArgument) when episodes, medoids or restarts is < 1, there
// are no rows, or the rows differ in length.
Episodes cluster_episodes(std::span<const std::vector<float>> embeddings, const EpisodeOptions& options);

// The episode whose centroid is most cosine-similar to query (ties: the lower
// index). Error(kInvalidArgument) when there are no episodes or the query's
// length differs from the centroids'.
int route(const Episodes& episodes, std::span<const float> query);

}  // namespace lazykv::eval
