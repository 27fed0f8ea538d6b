#include "common/data_auth.h"

#include "gtest/gtest.h"

namespace pscluster {
namespace {

TEST(DataAuthTest, SecretsDependOnKeyAndJob) {
  const std::string a = DeriveJobDataSecret("cluster key one", "job-1");
  EXPECT_EQ(a.size(), kDataSecretBytes);
  EXPECT_EQ(a, DeriveJobDataSecret("cluster key one", "job-1"));
  EXPECT_NE(a, DeriveJobDataSecret("cluster key one", "job-2"));
  EXPECT_NE(a, DeriveJobDataSecret("cluster key two", "job-1"));
}

TEST(DataAuthTest, ProofBindsEveryField) {
  const std::string secret = DeriveJobDataSecret("k", "job");
  const std::string nonce(kDataNonceBytes, 'n');
  const std::string p = DataAuthProof(secret, nonce, "job", 3, 1);
  EXPECT_EQ(p.size(), kDataProofBytes);
  EXPECT_TRUE(SameSecret(p, DataAuthProof(secret, nonce, "job", 3, 1)));
  EXPECT_FALSE(SameSecret(p, DataAuthProof(secret, std::string(kDataNonceBytes, 'm'), "job", 3, 1)));
  EXPECT_FALSE(SameSecret(p, DataAuthProof(secret, nonce, "job2", 3, 1)));
  EXPECT_FALSE(SameSecret(p, DataAuthProof(secret, nonce, "job", 4, 1)));
  EXPECT_FALSE(SameSecret(p, DataAuthProof(secret, nonce, "job", 3, 2)));
  EXPECT_FALSE(SameSecret(p, DataAuthProof(DeriveJobDataSecret("k", "other"), nonce, "job", 3, 1)));
  // Field boundaries are encoded: moving a byte from the nonce to the job changes the proof.
  EXPECT_FALSE(SameSecret(DataAuthProof(secret, "ab", "c", 0, 0), DataAuthProof(secret, "a", "bc", 0, 0)));
}

TEST(DataAuthTest, SameSecretComparesSizes) {
  EXPECT_TRUE(SameSecret("", ""));
  EXPECT_FALSE(SameSecret("abc", "ab"));
  EXPECT_FALSE(SameSecret("abc", "abd"));
}

TEST(DataAuthTest, RandomBytesDiffer) {
  auto a = RandomBytes(kDataNonceBytes);
  auto b = RandomBytes(kDataNonceBytes);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->size(), kDataNonceBytes);
  EXPECT_NE(*a, *b);
}

TEST(DataAuthTest, GrpcMetadataValueRoundTripsAndRefusesMalformedOnes) {
  const std::string secret = DeriveJobDataSecret("key", "job");
  EXPECT_EQ(GrpcDataAuthValue(DataAuth{"job", 3, 4, ""}), "") << "no secret, nothing to prove";
  const std::string v = GrpcDataAuthValue(DataAuth{"job", 3, 4, secret});
  auto c = ParseGrpcDataAuth(v);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->worker, 3u);
  EXPECT_EQ(c->attempt, 4u);
  EXPECT_EQ(c->proof, DataAuthProof(secret, kGrpcDataNonce, "job", 3, 4));
  for (const char* bad : {"", "3:4", "x:4:00", "3:4:abc", "3:4:5:6", "-1:4:00"}) {
    EXPECT_FALSE(ParseGrpcDataAuth(bad).ok()) << bad;
  }
  std::string not_hex = v;
  not_hex.back() = 'g';
  EXPECT_FALSE(ParseGrpcDataAuth(not_hex).ok());
}

}  // namespace
}  // namespace pscluster
