// Helpers for tests that run ops on a backend: device arrays, poisoning, fresh random inputs,
// and comparison against float64 references.
#ifndef PSCLUSTER_KERNELS_TESTING_TEST_UTIL_H_
#define PSCLUSTER_KERNELS_TESTING_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "kernels/testing/reference_ops.h"

namespace pscluster::kernels::testing {

// A seed that differs from run to run; tests print it (SCOPED_TRACE) so a failure can be
// replayed by hard-coding it.
inline uint64_t FreshSeed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

// The float written over every output before an op runs: a NaN that no op produces itself.
inline float PoisonFloat() {
  const uint32_t bits = 0x7fa5a5a5u;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
constexpr int32_t kPoisonInt = 0x5a5a5a5a;

inline std::vector<float> RandomFloats(std::mt19937_64& rng, int64_t n, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline std::vector<int32_t> RandomInts(std::mt19937_64& rng, int64_t n, int32_t lo, int32_t hi) {
  std::uniform_int_distribution<int32_t> d(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = d(rng);
  return v;
}

// A typed device array of a backend.
template <typename T>
class DeviceArray {
 public:
  DeviceArray(Backend* backend, int64_t n) : backend_(backend), n_(n) {
    auto b = backend->Allocate(static_cast<size_t>(n) * sizeof(T));
    EXPECT_TRUE(b.ok()) << b.status();
    if (b.ok()) buffer_ = std::move(*b);
  }
  DeviceArray(Backend* backend, const std::vector<T>& values)
      : DeviceArray(backend, static_cast<int64_t>(values.size())) {
    Upload(values);
  }
  T* get() const { return buffer_.template as<T>(); }
  int64_t size() const { return n_; }
  void Upload(const std::vector<T>& values) {
    ASSERT_EQ(static_cast<int64_t>(values.size()), n_);
    ASSERT_TRUE(backend_->CopyToDevice(values.data(), get(), n_ * sizeof(T)).ok());
    ASSERT_TRUE(backend_->Synchronize().ok());
  }
  void Poison() {
    if constexpr (std::is_same_v<T, float>) {
      Upload(std::vector<T>(n_, PoisonFloat()));
    } else {
      Upload(std::vector<T>(n_, static_cast<T>(kPoisonInt)));
    }
  }
  std::vector<T> Download() const {
    std::vector<T> out(n_);
    EXPECT_TRUE(backend_->CopyToHost(get(), out.data(), n_ * sizeof(T)).ok());
    EXPECT_TRUE(backend_->Synchronize().ok());
    return out;
  }

 private:
  Backend* backend_;
  int64_t n_;
  Buffer buffer_;
};

// Every element of `got` within the reference's bound (and no NaN where the reference has none).
inline ::testing::AssertionResult WithinBounds(const std::vector<float>& got, const Reference& ref,
                                               double bound_scale = 1.0) {
  if (got.size() != ref.value.size()) {
    return ::testing::AssertionFailure()
           << "size " << got.size() << " != reference size " << ref.value.size();
  }
  int failures = 0;
  std::string detail;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref.value[i]);
    const bool ok = std::isnan(ref.value[i]) ? std::isnan(got[i])
                                             : !std::isnan(got[i]) &&
                                                   err <= ref.bound[i] * bound_scale;
    if (!ok && ++failures <= 5) {
      absl::StrAppend(&detail, "\n  [", i, "] got ", got[i], " want ", ref.value[i], " (error ",
                      err, " > bound ", ref.bound[i] * bound_scale, ")");
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << failures << " of " << got.size()
                                       << " elements outside the float32 bound:" << detail;
}

}  // namespace pscluster::kernels::testing

#endif  // PSCLUSTER_KERNELS_TESTING_TEST_UTIL_H_
