#include "server/payload.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/dtype.h"

namespace pscluster {
namespace {

// Float data cut into pieces at awkward places: inside elements and at odd addresses.
struct Cut {
  std::string storage;
  Payload payload;
};

Cut Make(const std::vector<float>& v, const std::vector<size_t>& cuts) {
  Cut c;
  c.storage = std::string(1, 'p') + std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  std::vector<absl::string_view> pieces;
  size_t at = 1;  // Everything starts one byte past an aligned address.
  for (size_t cut : cuts) {
    pieces.emplace_back(c.storage.data() + at, cut + 1 - at);
    at = cut + 1;
  }
  pieces.emplace_back(c.storage.data() + at, c.storage.size() - at);
  c.payload = Payload(pieces, nullptr);
  return c;
}

TEST(PayloadTest, RunsCoverEveryElementInOrderWhateverThePieces) {
  std::vector<float> v(5000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f;
  for (auto cuts : std::vector<std::vector<size_t>>{{}, {6}, {8, 4000, 4003, 12000}, {19999}}) {
    Cut c = Make(v, cuts);
    ASSERT_EQ(c.payload.size(), 20000u);
    for (size_t first : {0ul, 3ul, 1000ul}) {
      std::vector<float> got(v.size() - first, -1.f);
      float scratch[64];
      size_t expect_next = 0;
      c.payload.ForEachFloatRun(v1::DT_FLOAT32, first, got.size(), scratch, 64,
                                [&](size_t i, const float* g, size_t k) {
                                  ASSERT_EQ(i, expect_next);
                                  std::memcpy(got.data() + i, g, k * 4);
                                  expect_next = i + k;
                                });
      EXPECT_EQ(expect_next, got.size());
      EXPECT_TRUE(std::equal(got.begin(), got.end(), v.begin() + first));
    }
  }
}

TEST(PayloadTest, AlignedPiecesAreReadInPlace) {
  std::vector<float> v(1000, 1.f);
  Payload p = Payload::FromString(std::string(reinterpret_cast<char*>(v.data()), 4000));
  float scratch[16];
  int runs = 0;
  p.ForEachFloatRun(v1::DT_FLOAT32, 0, 1000, scratch, 16, [&](size_t, const float* g, size_t k) {
    EXPECT_NE(g, scratch);
    EXPECT_EQ(k, 1000u);
    ++runs;
  });
  EXPECT_EQ(runs, 1);
}

TEST(PayloadTest, HalfPrecisionIsWidened) {
  std::vector<uint16_t> h = {FloatToHalf(1.5f), FloatToHalf(-2.f), FloatToHalf(0.25f)};
  Payload p = Payload::FromString(std::string(reinterpret_cast<char*>(h.data()), 6));
  std::vector<float> out;
  float scratch[2];
  p.ForEachFloatRun(v1::DT_FLOAT16, 0, 3, scratch, 2, [&](size_t, const float* g, size_t k) {
    out.insert(out.end(), g, g + k);
  });
  EXPECT_EQ(out, (std::vector<float>{1.5f, -2.f, 0.25f}));
  std::vector<float> d(2);
  p.DecodeFloats(v1::DT_FLOAT16, 1, 2, d.data());
  EXPECT_EQ(d, (std::vector<float>{-2.f, 0.25f}));
}

}  // namespace
}  // namespace pscluster
