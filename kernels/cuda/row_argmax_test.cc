// The CUDA softmax's argmax (row_argmax.h) run on the host as one warp runs it: 32 lanes with
// strided elements, then a butterfly of xor partners. It must equal the CPU backend's
// sequential scan on rows with NaN anywhere, infinities, signed zeros and ties. Runs without a
// GPU; ops_cuda_test and cuda_device_test check the kernel itself against the CPU backend.
#include "kernels/cuda/row_argmax.h"

#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace pscluster::kernels::argmax {
namespace {

// cpu_dense_ops.cc's scan.
int64_t CpuArgmax(const std::vector<float>& z) {
  float max = z[0];
  int64_t arg = 0;
  for (size_t j = 1; j < z.size(); ++j) {
    if (z[j] > max) {
      max = z[j];
      arg = static_cast<int64_t>(j);
    }
  }
  return arg;
}

int64_t WarpArgmax(const std::vector<float>& z) {
  const int64_t classes = static_cast<int64_t>(z.size());
  std::array<Candidate, 32> lanes;
  for (int lane = 0; lane < 32; ++lane) {
    lanes[lane] = None(classes);
    for (int64_t j = lane; j < classes; j += 32) Offer(&lanes[lane], z[j], j, classes);
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    std::array<Candidate, 32> next;
    for (int lane = 0; lane < 32; ++lane) {
      next[lane] = Better(lanes[lane], lanes[lane ^ offset], classes);
    }
    lanes = next;
  }
  const int64_t answer = Finish(lanes[0], z[0], classes);
  for (int lane = 1; lane < 32; ++lane) {
    EXPECT_EQ(Finish(lanes[lane], z[0], classes), answer) << "lanes disagree";
  }
  return answer;
}

TEST(RowArgmaxTest, NaNPlacementsThatSplitTheOldKernelFromTheCpu) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // A NaN as a lane's first element used to hide the rest of that lane's elements.
  std::vector<float> z(40, 0.0f);
  z[1] = nan;
  z[33] = 5.0f;
  EXPECT_EQ(WarpArgmax(z), 33);
  EXPECT_EQ(CpuArgmax(z), 33);
  // NaN first: the scan never moves off index 0.
  std::vector<float> first = {nan, 1.0f, 9.0f};
  EXPECT_EQ(WarpArgmax(first), 0);
  EXPECT_EQ(CpuArgmax(first), 0);
  std::vector<float> all_nan(70, nan);
  EXPECT_EQ(WarpArgmax(all_nan), 0);
}

TEST(RowArgmaxTest, MatchesTheCpuScanOnRandomRows) {
  std::mt19937_64 rng(11);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), 0.0f, -0.0f, 2.0f};
  std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
  std::uniform_int_distribution<int> pick(0, 5);
  for (int64_t classes : {1, 2, 10, 31, 32, 33, 64, 100, 1000}) {
    for (int rep = 0; rep < 300; ++rep) {
      std::vector<float> z(classes);
      const int mode = rep % 3;  // 0: continuous; 1: few values (ties); 2: many specials.
      for (float& v : z) {
        v = mode == 1 ? std::round(uniform(rng)) : uniform(rng);
        if ((mode == 2 && pick(rng) < 3) || (mode != 2 && pick(rng) == 0 && rep % 5 == 0)) {
          v = specials[pick(rng)];
        }
      }
      ASSERT_EQ(WarpArgmax(z), CpuArgmax(z)) << "classes " << classes << " rep " << rep;
    }
  }
}

}  // namespace
}  // namespace pscluster::kernels::argmax
