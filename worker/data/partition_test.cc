#include "worker/data/partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace pscluster::data {
namespace {

TEST(PartitionTest, PartsAreDisjointCoverAllAndRepeat) {
  constexpr int64_t kN = 1003;
  std::set<int64_t> seen;
  size_t total = 0;
  for (uint32_t i = 0; i < 3; ++i) {
    auto part = PartitionExamples(kN, 42, {i, 3, 0, 0});
    ASSERT_TRUE(part.ok());
    EXPECT_NEAR(static_cast<double>(part->size()), kN / 3.0, 1.0);
    total += part->size();
    seen.insert(part->begin(), part->end());
    EXPECT_EQ(*part, *PartitionExamples(kN, 42, {i, 3, 0, 0}));  // Deterministic.
  }
  EXPECT_EQ(total, static_cast<size_t>(kN));
  EXPECT_EQ(seen.size(), static_cast<size_t>(kN));
  EXPECT_NE(*PartitionExamples(kN, 42, {0, 3, 0, 0}), *PartitionExamples(kN, 43, {0, 3, 0, 0}));
}

TEST(PartitionTest, ExplicitRanges) {
  auto a = PartitionExamples(100, 1, {0, 2, 0, 70});
  auto b = PartitionExamples(100, 1, {1, 2, 70, 100});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 70u);
  EXPECT_EQ(b->size(), 30u);
  std::set<int64_t> all(a->begin(), a->end());
  all.insert(b->begin(), b->end());
  EXPECT_EQ(all.size(), 100u);
}

TEST(PartitionTest, BadSpecsAreInvalidArgument) {
  EXPECT_EQ(PartitionExamples(100, 1, {3, 3, 0, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PartitionExamples(100, 1, {0, 0, 0, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PartitionExamples(100, 1, {0, 1, 50, 101}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PartitionExamples(2, 1, {0, 3, 0, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PartitionExamples(0, 1, {0, 1, 0, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A rank that took over the parts of ranks that left the job reads its own part, then theirs.
TEST(PartitionTest, ExtraPartsOfRanksThatLeftFollowTheOwnPart) {
  constexpr int64_t kN = 1003;
  PartitionSpec spec{2, 4, 0, 0};
  spec.also = {0, 3};
  auto got = PartitionExamples(kN, 9, spec);
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<int64_t> want;
  for (uint32_t i : {2u, 0u, 3u}) {
    auto part = *PartitionExamples(kN, 9, {i, 4, 0, 0});
    want.insert(want.end(), part.begin(), part.end());
  }
  EXPECT_EQ(*got, want);
  // Its own part again, a part past the count, a repeat, or a range: refused.
  for (std::vector<uint32_t> bad : std::vector<std::vector<uint32_t>>{{2}, {4}, {0, 0}}) {
    PartitionSpec b{2, 4, 0, 0};
    b.also = bad;
    auto s = PartitionExamples(kN, 9, b);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("partition.also["), std::string::npos) << s.status();
  }
  PartitionSpec range{0, 2, 0, 500};
  range.also = {1};
  EXPECT_EQ(PartitionExamples(kN, 9, range).status().code(), absl::StatusCode::kInvalidArgument);
}

// Data balancing: parts sized by shares still cut the same permutation into disjoint parts that
// cover it, and each rank's batch is its share of the job's examples per step.
TEST(PartitionTest, SharesSizeThePartsAndTheBatches) {
  constexpr int64_t kN = 60000;
  const std::vector<uint32_t> shares = {1500, 500, 1000};
  std::set<int64_t> seen;
  size_t sizes[3];
  uint32_t batches = 0;
  for (uint32_t i = 0; i < 3; ++i) {
    PartitionSpec spec{i, 3, 0, 0};
    spec.shares = shares;
    auto part = PartitionExamples(kN, 5, spec);
    ASSERT_TRUE(part.ok()) << part.status();
    sizes[i] = part->size();
    seen.insert(part->begin(), part->end());
    batches += RankBatch(spec, 128);
  }
  EXPECT_EQ(sizes[0], 30000u);
  EXPECT_EQ(sizes[1], 10000u);
  EXPECT_EQ(sizes[2], 20000u);
  EXPECT_EQ(seen.size(), static_cast<size_t>(kN));
  EXPECT_EQ(batches, 3u * 128) << "the job's examples per step are unchanged";
  PartitionSpec fast{0, 3, 0, 0};
  fast.shares = shares;
  EXPECT_EQ(RankBatch(fast, 128), 192u);
  // The same permutation as equal parts: equal shares give the equal parts exactly.
  PartitionSpec even{1, 3, 0, 0};
  even.shares = {7, 7, 7};
  EXPECT_EQ(*PartitionExamples(kN, 5, even), *PartitionExamples(kN, 5, {1, 3, 0, 0}));
  EXPECT_EQ(RankBatch(even, 128), 128u);
  // A rank that took over a part reads it with its share, in a batch that grows to match.
  PartitionSpec adopter{1, 3, 0, 0};
  adopter.shares = shares;
  adopter.also = {0};
  auto both = PartitionExamples(kN, 5, adopter);
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->size(), 40000u);
  EXPECT_EQ(RankBatch(adopter, 128), 256u);
  // Equal parts: the job's batch, times the parts read.
  EXPECT_EQ(RankBatch({2, 3, 0, 0}, 100), 100u);
  PartitionSpec two{2, 3, 0, 0};
  two.also = {1};
  EXPECT_EQ(RankBatch(two, 100), 200u);
  PartitionSpec tiny{1, 2, 0, 0};
  tiny.shares = {kMaxShare, 1};
  EXPECT_EQ(RankBatch(tiny, 10), 1u) << "at least one example per step";
}

TEST(PartitionTest, BadSharesAreInvalidArgument) {
  auto message = [](PartitionSpec spec) {
    return std::string(PartitionExamples(1000, 1, spec).status().message());
  };
  PartitionSpec spec{0, 2, 0, 0};
  spec.shares = {1, 2, 3};
  EXPECT_NE(message(spec).find("partition.shares: 3 shares for 2 parts"), std::string::npos)
      << message(spec);
  spec.shares = {0, 1};
  EXPECT_NE(message(spec).find("partition.shares[0]: 0 is not in"), std::string::npos);
  spec.shares = {1, kMaxShare + 1};
  EXPECT_NE(message(spec).find("partition.shares[1]"), std::string::npos);
  PartitionSpec range{0, 2, 0, 500};
  range.shares = {1, 1};
  EXPECT_NE(message(range).find("partition.shares: shares size parts"), std::string::npos);
  // A share so small that its part holds no example.
  PartitionSpec empty{1, 2, 0, 0};
  empty.shares = {1, kMaxShare};
  empty.also = {0};
  EXPECT_NE(message(empty).find("part 0 of 2 holds none of the 1000 examples"),
            std::string::npos)
      << message(empty);
}

TEST(PartitionTest, EpochOrderIsAPermutationThatChangesPerEpoch) {
  auto part = *PartitionExamples(500, 7, {1, 2, 0, 0});
  auto e0 = EpochOrder(part, 7, 0, 1);
  auto e1 = EpochOrder(part, 7, 1, 1);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(e0, EpochOrder(part, 7, 0, 1));
  auto sorted0 = e0, sorted_part = part;
  std::sort(sorted0.begin(), sorted0.end());
  std::sort(sorted_part.begin(), sorted_part.end());
  EXPECT_EQ(sorted0, sorted_part);
}

// Parts of a count of bytes (a streamed set's size): adjacent, covering [0, n), near n / count,
// with no overflow of n * part.
TEST(PartitionTest, PartBoundsOfManyUnitsAreAdjacentAndExact) {
  const uint64_t n = (uint64_t{1} << 62) + 12345;
  for (bool shares : {false, true}) {
    PartitionSpec spec{0, 7, 0, 0};
    if (shares) spec.shares = {1, 2, 3, 4, 5, 6, 7};
    uint64_t at = 0;
    for (uint32_t a = 0; a < spec.count; ++a) {
      auto [b, e] = PartBounds(n, spec, a);
      EXPECT_EQ(b, at);
      const double want = static_cast<double>(n) * (shares ? (a + 1) / 28.0 : 1 / 7.0);
      EXPECT_NEAR(static_cast<double>(e - b), want, want * 1e-9);
      at = e;
    }
    EXPECT_EQ(at, n);
  }
}

}  // namespace
}  // namespace pscluster::data
