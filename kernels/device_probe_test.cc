#include "kernels/device_probe.h"

#include <gtest/gtest.h>

namespace pscluster {
namespace {

// Whichever way the build went, the probe must say so truthfully and never crash.
TEST(DeviceProbeTest, ReportsHowTheBuildWasConfigured) {
  CudaAvailability c = ProbeCuda();
#ifdef PSCLUSTER_HAVE_CUDA
  EXPECT_TRUE(c.compiled);
  // Linked against the toolkit's runtime and cuBLAS: both answer their version without a device.
  EXPECT_GE(c.runtime_version, 11000);
  EXPECT_GE(c.cublas_version, 110000);
  if (c.device_count == 0) {
    EXPECT_FALSE(c.reason.empty());
    EXPECT_FALSE(c.usable());
  } else {
    EXPECT_FALSE(c.device_name.empty());
    EXPECT_TRUE(c.usable());
  }
#else
  EXPECT_FALSE(c.compiled);
  EXPECT_FALSE(c.usable());
  EXPECT_EQ(c.runtime_version, 0);
  EXPECT_NE(c.reason.find("without a CUDA toolkit"), std::string::npos);
#endif
}

}  // namespace
}  // namespace pscluster
