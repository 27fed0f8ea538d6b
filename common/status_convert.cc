#include "common/status_convert.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace pscluster {

// The canonical codes have the same numbers in absl and gRPC; the static_asserts below keep the
// casts honest.
static_assert(static_cast<int>(absl::StatusCode::kCancelled) == grpc::StatusCode::CANCELLED);
static_assert(static_cast<int>(absl::StatusCode::kInvalidArgument) ==
              grpc::StatusCode::INVALID_ARGUMENT);
static_assert(static_cast<int>(absl::StatusCode::kFailedPrecondition) ==
              grpc::StatusCode::FAILED_PRECONDITION);
static_assert(static_cast<int>(absl::StatusCode::kUnauthenticated) ==
              grpc::StatusCode::UNAUTHENTICATED);

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  int code = static_cast<int>(status.error_code());
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(status.error_message());
  }
  return absl::Status(static_cast<absl::StatusCode>(code), status.error_message());
}

absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view context) {
  absl::Status s = FromGrpcStatus(status);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

}  // namespace pscluster
