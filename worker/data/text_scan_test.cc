#include "worker/data/text_scan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"

namespace pscluster::data {
namespace {

bool Float(const std::string& s, float* out, size_t* used = nullptr) {
  const char* p = s.data();
  bool ok = ScanFloat(&p, s.data() + s.size(), out);
  if (used != nullptr) *used = static_cast<size_t>(p - s.data());
  return ok;
}

// Random decimal strings in every shape the scanner takes (short and long mantissas, leading
// zeros, a point anywhere, exponents), each converted exactly as strtof converts it.
TEST(TextScanTest, FloatsRoundLikeStrtof) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    std::string s;
    if (rng() % 4 == 0) s += (rng() % 2 == 0) ? "-" : "+";
    const int digits = 1 + static_cast<int>(rng() % 12);
    const int point = static_cast<int>(rng() % (digits + 2)) - 1;  // -1: no point.
    if (point == 0) s += ".";
    for (int d = 0; d < digits; ++d) {
      s += static_cast<char>('0' + (d == 0 && rng() % 3 == 0 ? 0 : rng() % 10));
      if (point > 0 && d + 1 == point) s += ".";
    }
    if (rng() % 5 == 0) absl::StrAppend(&s, "e", static_cast<int>(rng() % 51) - 25);
    float got = 0;
    size_t used = 0;
    ASSERT_TRUE(Float(s, &got, &used)) << s;
    EXPECT_EQ(used, s.size()) << s;
    const float want = std::strtof(s.c_str(), nullptr);
    uint32_t a, b;
    std::memcpy(&a, &got, 4);
    std::memcpy(&b, &want, 4);
    ASSERT_EQ(a, b) << s << ": " << got << " vs " << want;
  }
}

TEST(TextScanTest, FloatsStopAtTheFirstCharacterNotPartOfTheNumber) {
  float v = 0;
  size_t used = 0;
  ASSERT_TRUE(Float("0.25:3", &v, &used));
  EXPECT_EQ(v, 0.25f);
  EXPECT_EQ(used, 4u);
  ASSERT_TRUE(Float("7e", &v, &used));  // An 'e' with no digits is not an exponent.
  EXPECT_EQ(v, 7.0f);
  EXPECT_EQ(used, 1u);
  ASSERT_TRUE(Float("1.5.2", &v, &used));
  EXPECT_EQ(used, 3u);
}

TEST(TextScanTest, NonNumbersAndNonFiniteValuesAreRefused) {
  float v = 0;
  for (const char* s : {"", "-", "+", ".", "-.", "e5", "inf", "-inf", "nan", "NaN", "x1", "1e39",
                        "-3.5e38", "99999999999999999999999999999999999999999"}) {
    size_t used = 99;
    EXPECT_FALSE(Float(s, &v, &used)) << s;
    EXPECT_EQ(used, 0u) << s;
  }
  // Below float's range reads as what strtof gives (0 or a denormal), not an error.
  ASSERT_TRUE(Float("1e-50", &v));
  EXPECT_EQ(v, 0.0f);
}

TEST(TextScanTest, IntegersWithinRange) {
  auto scan = [](const std::string& s, int64_t* v) {
    const char* p = s.data();
    return ScanInt64(&p, s.data() + s.size(), v) && p == s.data() + s.size();
  };
  int64_t v = 0;
  EXPECT_TRUE(scan("9223372036854775807", &v));
  EXPECT_EQ(v, INT64_MAX);
  EXPECT_TRUE(scan("-9223372036854775808", &v));
  EXPECT_EQ(v, INT64_MIN);
  EXPECT_TRUE(scan("+12", &v));
  EXPECT_EQ(v, 12);
  EXPECT_FALSE(scan("9223372036854775808", &v));
  EXPECT_FALSE(scan("-", &v));
  EXPECT_FALSE(scan("", &v));
  uint64_t u = 0;
  std::string max = "18446744073709551615", over = "18446744073709551616";
  const char* p = max.data();
  EXPECT_TRUE(ScanUint64(&p, max.data() + max.size(), &u));
  EXPECT_EQ(u, UINT64_MAX);
  p = over.data();
  EXPECT_FALSE(ScanUint64(&p, over.data() + over.size(), &u));
  EXPECT_EQ(p, over.data());
}

TEST(TextScanTest, HashesDependOnEveryByteTheLengthAndTheSeed) {
  std::set<uint64_t> seen;
  std::string s;
  for (int len = 0; len < 40; ++len) {
    EXPECT_TRUE(seen.insert(HashBytes(s, 1)).second) << len;
    EXPECT_EQ(HashBytes(s, 1), HashBytes(std::string(s), 1));
    EXPECT_NE(HashBytes(s, 1), HashBytes(s, 2));
    for (size_t i = 0; i < s.size(); ++i) {
      std::string t = s;
      t[i] ^= 1;
      EXPECT_NE(HashBytes(t, 1), HashBytes(s, 1)) << len << " " << i;
    }
    s.push_back(static_cast<char>('a' + len % 26));
  }
  // Spread: the low bits of 100,000 hashes fill 1,024 buckets evenly.
  std::vector<int> buckets(1024);
  for (int i = 0; i < 100000; ++i) ++buckets[HashBytes(absl::StrCat("v", i), 3) % 1024];
  for (int c : buckets) EXPECT_NEAR(c, 100000 / 1024.0, 60);
}

}  // namespace
}  // namespace pscluster::data
