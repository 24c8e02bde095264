// EpiCache's episode clustering: the hashed TF-IDF embedder, K-means with
// medoids, and routing a question to its episode.
#include "eval/episodes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/unit/error_code_of.h"

namespace lazykv::eval {
namespace {

// Floats hold the normalised weights to ~1e-7; the bound leaves room for that.
constexpr double kFloatTolerance = 1e-6;

const std::vector<std::string> kTopicSegments = {
    "I bought apples and oranges at the fruit market",
    "The fruit stall sells fresh oranges and green apples",
    "Apples, oranges and other fruit make a good breakfast",
    "The trains leave the railway stations every hour",
    "Railway stations were crowded and the trains were late",
    "Old trains still run between the two railway stations",
};

// The one bucket a single word lands in.
int bucket_of(const TextEmbedder& embedder, const std::string& word) {
  const std::vector<float> embedding = embedder.embed(word);
  return int(std::max_element(embedding.begin(), embedding.end()) - embedding.begin());
}

double norm(const std::vector<float>& v) {
  double sum = 0;
  for (float x : v) sum += double(x) * x;
  return std::sqrt(sum);
}

std::vector<std::vector<float>> embed_all(const TextEmbedder& embedder, const std::vector<std::string>& texts) {
  std::vector<std::vector<float>> embeddings;
  for (const std::string& text : texts) embeddings.push_back(embedder.embed(text));
  return embeddings;
}

TEST(EpisodesTest, EmbedderWeightsByTfTimesSmoothIdf) {
  // N = 3; df(apple) = 3, df(banana) = 2, df(cherry) = 1, df(zebra) = 0.
  const std::vector<std::string> texts = {"apple banana", "Apple cherry", "apple, banana banana"};
  const TextEmbedder embedder(texts);
  const double idf_apple = std::log(4.0 / 4.0) + 1;  // = 1
  const double idf_banana = std::log(4.0 / 3.0) + 1;
  const double idf_zebra = std::log(4.0 / 1.0) + 1;
  const int apple = bucket_of(embedder, "apple"), banana = bucket_of(embedder, "banana");
  const int cherry = bucket_of(embedder, "cherry"), zebra = bucket_of(embedder, "zebra");
  ASSERT_EQ(std::set<int>({apple, banana, cherry, zebra}).size(), 4u) << "the words must not collide";

  // tf(banana) = 2: weights (1, 2 * 1.2877), normalised.
  const std::vector<float> v = embedder.embed("apple banana banana");
  const double length = std::hypot(idf_apple, 2 * idf_banana);
  EXPECT_NEAR(v[apple], idf_apple / length, kFloatTolerance);
  EXPECT_NEAR(v[banana], 2 * idf_banana / length, kFloatTolerance);
  EXPECT_NEAR(v[apple], 0.3619650, kFloatTolerance);
  EXPECT_NEAR(v[banana], 0.9321917, kFloatTolerance);

  // A word the build set never saw gets idf ln(1 + N) + 1.
  const std::vector<float> w = embedder.embed("zebra apple");
  EXPECT_NEAR(w[zebra] / w[apple], idf_zebra / idf_apple, kFloatTolerance);

  // The word in every text weighs less than the rare one.
  const std::vector<float> u = embedder.embed("apple cherry");
  EXPECT_LT(u[apple], u[cherry]);
}

TEST(EpisodesTest, EmbeddingIsUnitNormAndCaseAndPunctuationInsensitive) {
  const TextEmbedder embedder(kTopicSegments);
  for (const std::string& text : kTopicSegments) EXPECT_NEAR(norm(embedder.embed(text)), 1.0, kFloatTolerance);
  EXPECT_EQ(embedder.embed("Fresh APPLES, oranges!"), embedder.embed("fresh apples oranges"));
  EXPECT_EQ(embedder.embed(kTopicSegments[0]), embedder.embed(kTopicSegments[0]));
  EXPECT_EQ(embedder.embed("a1b2").size(), size_t(kEmbeddingDims));
  EXPECT_EQ(norm(embedder.embed(" ,.!? ")), 0.0) << "no words: all zeros";
}

TEST(EpisodesTest, SeparatedTopicsFormOneEpisodeEach) {
  const TextEmbedder embedder(kTopicSegments);
  const auto embeddings = embed_all(embedder, kTopicSegments);
  const Episodes episodes = cluster_episodes(embeddings, {.episodes = 2});
  ASSERT_EQ(episodes.centroids.size(), 2u);
  ASSERT_EQ(episodes.assignment.size(), 6u);
  const int fruit = episodes.assignment[0], trains = episodes.assignment[3];
  EXPECT_NE(fruit, trains);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(episodes.assignment[i], fruit) << i;
  for (int i = 3; i < 6; ++i) EXPECT_EQ(episodes.assignment[i], trains) << i;

  // Medoids: 2 per episode, ascending, from the episode's own topic.
  for (int e = 0; e < 2; ++e) {
    const std::vector<int>& members = episodes.members[e];
    ASSERT_EQ(members.size(), 2u);
    EXPECT_LT(members[0], members[1]);
    for (int m : members) EXPECT_EQ(episodes.assignment[m], e) << m;
  }

  EXPECT_EQ(route(episodes, embedder.embed("Which railway stations do the trains stop at?")), trains);
  EXPECT_EQ(route(episodes, embedder.embed("Are the apples sweeter than the oranges?")), fruit);
}

TEST(EpisodesTest, CentroidsAreClusterMeans) {
  const std::vector<std::vector<float>> points = {{0, 0}, {10, 10}, {0, 1}, {10, 11}};
  const Episodes episodes = cluster_episodes(points, {.episodes = 2, .medoids = 1});
  const int low = episodes.assignment[0];
  EXPECT_EQ(episodes.assignment, (std::vector<int>{low, 1 - low, low, 1 - low}));
  EXPECT_EQ(episodes.centroids[low], (std::vector<float>{0, 0.5}));
  EXPECT_EQ(episodes.centroids[1 - low], (std::vector<float>{10, 10.5}));
}

TEST(EpisodesTest, RestartsFindThreeSeparatedGroups) {
  const std::vector<std::vector<float>> points = {
      {0, 0}, {0, 1}, {1, 0}, {50, 50}, {50, 51}, {51, 50}, {-50, 50}, {-50, 51}};
  const Episodes episodes = cluster_episodes(points, {.episodes = 3, .medoids = 1});
  const std::vector<int>& a = episodes.assignment;
  EXPECT_TRUE(a[0] == a[1] && a[1] == a[2]);
  EXPECT_TRUE(a[3] == a[4] && a[4] == a[5]);
  EXPECT_EQ(a[6], a[7]);
  EXPECT_EQ(std::set<int>({a[0], a[3], a[6]}).size(), 3u);
}

// Sum of squared distances of the points to their episode's centroid.
double inertia(const std::vector<std::vector<float>>& points, const Episodes& episodes) {
  double sum = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    const std::vector<float>& centroid = episodes.centroids[episodes.assignment[i]];
    for (size_t d = 0; d < centroid.size(); ++d) sum += (points[i][d] - centroid[d]) * (points[i][d] - centroid[d]);
  }
  return sum;
}

TEST(EpisodesTest, MoreRestartsKeepTheLowestInertia) {
  // A 6 x 5 grid has many local optima for K = 4. Restart 0 draws the same
  // centres whatever `restarts` is, so ten restarts can only do better.
  std::vector<std::vector<float>> grid;
  for (int i = 0; i < 30; ++i) grid.push_back({float(i % 6), float(i / 6)});
  int improved = 0;
  for (uint64_t seed = 0; seed < 10; ++seed) {
    const double one = inertia(grid, cluster_episodes(grid, {.episodes = 4, .restarts = 1, .seed = seed}));
    const double ten = inertia(grid, cluster_episodes(grid, {.episodes = 4, .restarts = 10, .seed = seed}));
    EXPECT_LE(ten, one + 1e-9) << "seed " << seed;
    improved += ten < one - 1e-9;
  }
  EXPECT_GT(improved, 0) << "no seed where a later restart beat the first";
}

TEST(EpisodesTest, SameSeedGivesIdenticalEpisodes) {
  const TextEmbedder embedder(kTopicSegments);
  const auto embeddings = embed_all(embedder, kTopicSegments);
  const EpisodeOptions options{.episodes = 3, .medoids = 2, .restarts = 4, .seed = 7};
  const Episodes first = cluster_episodes(embeddings, options);
  const Episodes second = cluster_episodes(embeddings, options);
  EXPECT_EQ(first.centroids, second.centroids);
  EXPECT_EQ(first.members, second.members);
  EXPECT_EQ(first.assignment, second.assignment);
}

TEST(EpisodesTest, MedoidsAreChosenAmongAllSegments) {
  // The lone point's episode has one member but still gets 2 medoids: the
  // nearest other segment (index 1, closer to {10, 0} than index 0) joins it.
  const std::vector<std::vector<float>> points = {{0, 1}, {1, 1}, {10, 0}};
  const Episodes episodes = cluster_episodes(points, {.episodes = 2, .medoids = 2});
  const int lone = episodes.assignment[2];
  EXPECT_EQ(episodes.members[lone], (std::vector<int>{1, 2}));
  EXPECT_EQ(episodes.members[1 - lone], (std::vector<int>{0, 1}));
}

TEST(EpisodesTest, EpisodesAndMedoidsAreCappedAtTheSegmentCount) {
  const std::vector<std::vector<float>> points = {{1, 0}, {0, 1}, {-1, 0}};
  const Episodes episodes = cluster_episodes(points, {.episodes = 10, .medoids = 5});
  ASSERT_EQ(episodes.centroids.size(), 3u);
  EXPECT_EQ(std::set<int>(episodes.assignment.begin(), episodes.assignment.end()).size(), 3u);
  for (const std::vector<int>& members : episodes.members) EXPECT_EQ(members, (std::vector<int>{0, 1, 2}));
}

TEST(EpisodesTest, DuplicateSegmentsLeaveNoEpisodeEmpty) {
  // Every centre lands on the same point; the empty cluster is reseeded.
  const std::vector<std::vector<float>> points(4, std::vector<float>{0.6f, 0.8f});
  const Episodes episodes = cluster_episodes(points, {.episodes = 2, .medoids = 1});
  EXPECT_EQ(std::set<int>(episodes.assignment.begin(), episodes.assignment.end()), (std::set<int>{0, 1}));
}

TEST(EpisodesTest, BadArgumentsAreRefused) {
  const std::vector<std::vector<float>> points = {{1, 0}, {0, 1}};
  const std::vector<std::vector<float>> ragged = {{1, 0}, {0, 1, 0}};
  const std::vector<std::vector<float>> none;
  std::string message;
  auto cluster = [](const std::vector<std::vector<float>>& rows, EpisodeOptions options) {
    return [rows, options] { cluster_episodes(rows, options); };
  };
  EXPECT_EQ(code_of(cluster(points, {.episodes = 0}), &message), ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("episodes must be >= 1"), std::string::npos) << message;
  EXPECT_EQ(code_of(cluster(points, {.medoids = 0}), &message), ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("medoids"), std::string::npos) << message;
  EXPECT_EQ(code_of(cluster(points, {.restarts = 0}), &message), ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("restarts"), std::string::npos) << message;
  EXPECT_EQ(code_of(cluster(none, {}), &message), ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("no segments"), std::string::npos) << message;
  EXPECT_EQ(code_of(cluster(ragged, {}), &message), ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("segment 1 has 3 dims"), std::string::npos) << message;

  const Episodes episodes = cluster_episodes(points, {.episodes = 2, .medoids = 1});
  const std::vector<float> wrong_length = {1, 0, 0};
  EXPECT_EQ(code_of([&] { route(episodes, wrong_length); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { route(Episodes{}, std::vector<float>{1, 0}); }), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace lazykv::eval
