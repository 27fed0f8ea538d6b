#include "kernels/create_backend.h"

#include <gtest/gtest.h>

#include "kernels/device_probe.h"

namespace pscluster::kernels {
namespace {

TEST(CreateBackendTest, CpuAlwaysWorks) {
  BackendOptions options;
  options.cpu_threads = 2;
  auto backend = CreateBackend("cpu", options);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->kind(), DeviceKind::kCpu);
  EXPECT_TRUE((*backend)->shares_host_memory());
  EXPECT_NE((*backend)->name().find("2 threads"), std::string::npos) << (*backend)->name();
  EXPECT_NE((*backend)->name().find("OpenBLAS"), std::string::npos) << (*backend)->name();
}

TEST(CreateBackendTest, AutoPicksCudaOnlyWhenUsable) {
  auto backend = CreateBackend("auto", BackendOptions());
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->kind(), ProbeCuda().usable() ? DeviceKind::kCuda : DeviceKind::kCpu);
}

TEST(CreateBackendTest, CudaWithoutDeviceIsFailedPrecondition) {
  if (ProbeCuda().usable()) GTEST_SKIP() << "a CUDA device is present";
  for (const char* device : {"cuda", "CUDA", "cuda:0", "cuda:3"}) {
    auto backend = CreateBackend(device, BackendOptions());
    ASSERT_FALSE(backend.ok()) << device;
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition)
        << backend.status();
    EXPECT_NE(backend.status().message().find("cuda"), absl::string_view::npos);
  }
}

TEST(CreateBackendTest, CudaOnAMissingOrdinalIsFailedPrecondition) {
  if (!ProbeCuda().usable()) GTEST_SKIP() << "no CUDA device";
  auto backend = CreateBackend("cuda:999", BackendOptions());
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition) << backend.status();
}

TEST(CreateBackendTest, UnknownDevicesAndBadOptionsAreInvalidArgument) {
  for (const char* device : {"", "gpu", "tpu", "cuda:", "cuda:-1", "cuda:x", "cpu0"}) {
    auto backend = CreateBackend(device, BackendOptions());
    ASSERT_FALSE(backend.ok()) << device;
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument) << backend.status();
  }
  BackendOptions bad;
  bad.cpu_threads = -1;
  EXPECT_EQ(CreateBackend("cpu", bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pscluster::kernels
