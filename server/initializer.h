// Initial values of tables. A value depends only on (seed, table name, element index) for dense
// tables and on (seed, table name, row key, column) for sparse rows, so every server (and a
// restarted one) computes the same values for the same parameter without coordination.
#ifndef PSCLUSTER_SERVER_INITIALIZER_H_
#define PSCLUSTER_SERVER_INITIALIZER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/job.pb.h"

namespace pscluster {

class Initializer {
 public:
  // REQUIRES: ValidateInitializer(spec.init(), ...) returned OK for `spec`.
  explicit Initializer(const v1::TableSpec& spec);

  // Values of dense elements [first, first + n) of the flattened tensor.
  void FillDense(uint64_t first, size_t n, float* out) const;
  // Values of the row `key` (row_width elements).
  void FillRow(uint64_t key, size_t width, float* out) const;

 private:
  float Draw(uint64_t h) const;

  v1::InitializerSpec::Kind kind_;
  uint64_t seed_;
  float a_ = 0.f;  // Constant value, lower bound or mean.
  float b_ = 0.f;  // Upper bound or standard deviation.
};

// Checks the initializer of `table` (its kind, a low < high range, stddev > 0, finite values).
// INVALID_ARGUMENT names `field` (e.g. "tables[0].init") and the member at fault.
absl::Status ValidateInitializer(const v1::TableSpec& table, absl::string_view field);

// fan_in / fan_out of a table, PyTorch's convention: a dense shape [out, in, k...] has fan_in =
// in * prod(k) and fan_out = out * prod(k); a vector has fan_in = fan_out = its length; a
// sparse table uses its row width for both.
void Fans(const v1::TableSpec& table, double* fan_in, double* fan_out);

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_INITIALIZER_H_
