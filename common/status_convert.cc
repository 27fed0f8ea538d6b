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

namespace {

// Backs `pos` off to the start of a UTF-8 sequence, so that a cut never splits a character.
size_t CharBoundary(absl::string_view s, size_t pos) {
  while (pos > 0 && pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) --pos;
  return pos;
}

}  // namespace

std::string BoundedStatusMessage(absl::string_view message) {
  if (message.size() <= kMaxStatusMessageBytes) return std::string(message);
  const size_t head = CharBoundary(message, kMaxStatusMessageBytes * 2 / 3);
  const size_t tail = CharBoundary(message, message.size() - kMaxStatusMessageBytes / 4);
  return absl::StrCat(message.substr(0, head), " ... [", tail - head, " bytes cut] ... ",
                      message.substr(tail));
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      BoundedStatusMessage(status.message()));
}

namespace {

absl::Status FromCode(int64_t code, absl::string_view message) {
  if (code == 0) return absl::OkStatus();
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(message);
  }
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

absl::Status WithContext(absl::Status s, absl::string_view context) {
  if (s.ok() || context.empty()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  return FromCode(static_cast<int>(status.error_code()), status.error_message());
}

absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view context) {
  return WithContext(FromGrpcStatus(status), context);
}

absl::Status StatusFromWire(uint32_t code, absl::string_view message, absl::string_view context) {
  return WithContext(FromCode(code, message), context);
}

}  // namespace pscluster
