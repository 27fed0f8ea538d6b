#include "common/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace pscluster {
namespace {

// Check values from RFC 3720 (iSCSI), appendix B.4, and the common "123456789" check value.
TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c("123456789"), 0xe3069283u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8a9136aau);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62a8ab43u);
  std::string inc, dec;
  for (int i = 0; i < 32; ++i) {
    inc.push_back(static_cast<char>(i));
    dec.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(Crc32c(inc), 0x46dd794eu);
  EXPECT_EQ(Crc32c(dec), 0x113fdb5cu);
}

TEST(Crc32cTest, ExtendEqualsWholeAndHardwareEqualsPortable) {
  std::mt19937 rng(3);
  std::string data(100003, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  uint32_t whole = Crc32c(data);
  EXPECT_EQ(whole, Crc32cExtendPortable(0, data.data(), data.size()));
  for (size_t cut : {0ul, 1ul, 7ul, 8ul, 4097ul, data.size()}) {
    uint32_t c = Crc32cExtend(0, data.data(), cut);
    c = Crc32cExtend(c, data.data() + cut, data.size() - cut);
    EXPECT_EQ(c, whole) << cut;
  }
  // Unaligned starts.
  for (size_t off = 1; off < 9; ++off) {
    EXPECT_EQ(Crc32cExtend(0, data.data() + off, 1000),
              Crc32cExtendPortable(0, data.data() + off, 1000));
  }
  data[5000] ^= 1;
  EXPECT_NE(Crc32c(data), whole);
}

}  // namespace
}  // namespace pscluster
