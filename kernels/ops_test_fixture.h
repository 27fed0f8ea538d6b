// The fixture of the backend op tests (ops_test.cc, ops_rows_test.cc, ops_interaction_test.cc):
// a fresh backend of KERNELS_TEST_DEVICE per test, a fresh random seed (recorded as a test
// property), and the status macros the tests share. On "cuda" without a usable device every test
// skips itself.
#ifndef PSCLUSTER_KERNELS_OPS_TEST_FIXTURE_H_
#define PSCLUSTER_KERNELS_OPS_TEST_FIXTURE_H_

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/create_backend.h"
#include "kernels/testing/test_util.h"

#ifndef KERNELS_TEST_DEVICE
#error "KERNELS_TEST_DEVICE must name the backend under test"
#endif

namespace pscluster::kernels {

// The test utilities every op test uses.
using testing::DeviceArray;
using testing::FreshSeed;
using testing::PoisonFloat;
using testing::RandomFloats;
using testing::RandomInts;
using testing::WithinBounds;

class OpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto backend = CreateBackend(KERNELS_TEST_DEVICE, BackendOptions());
    if (!backend.ok()) {
      if (std::string(KERNELS_TEST_DEVICE) == "cuda") {
        GTEST_SKIP() << "no CUDA device: " << backend.status();
      }
      FAIL() << backend.status();
    }
    backend_ = std::move(*backend);
    seed_ = testing::FreshSeed();
    rng_.seed(seed_);
    RecordProperty("seed", std::to_string(seed_));
  }
  // The status of an op together with the next Synchronize(): asynchronous backends report
  // device-side errors (bad indices) there.
  absl::Status Run(absl::Status op) {
    absl::Status sync = backend_->Synchronize();
    return op.ok() ? sync : op;
  }
  std::string Seed() const { return absl::StrCat("seed ", seed_); }

  std::unique_ptr<Backend> backend_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

#define EXPECT_CODE(expr, want)                                    \
  do {                                                             \
    absl::Status s_ = (expr);                                      \
    EXPECT_EQ(s_.code(), absl::StatusCode::want) << s_.ToString(); \
  } while (0)

// True when every element is the poison value, bit for bit (nothing was written).
inline bool AllPoison(const std::vector<float>& v) {
  const float poison = testing::PoisonFloat();
  for (const float& f : v) {
    if (std::memcmp(&f, &poison, sizeof(f)) != 0) return false;
  }
  return true;
}

inline bool HasSubstr(const absl::Status& s, const char* part) {
  return s.message().find(part) != absl::string_view::npos;
}

// INVALID_ARGUMENT whose message names the op and the offending argument.
#define EXPECT_INVALID_NAMING(expr, op, arg)                                   \
  do {                                                                         \
    absl::Status s_ = (expr);                                                  \
    EXPECT_EQ(s_.code(), absl::StatusCode::kInvalidArgument) << s_.ToString(); \
    EXPECT_TRUE(HasSubstr(s_, op) && HasSubstr(s_, arg))                       \
        << s_.ToString() << " does not name " << op << " and " << arg;         \
  } while (0)

}  // namespace pscluster::kernels

#endif  // PSCLUSTER_KERNELS_OPS_TEST_FIXTURE_H_
