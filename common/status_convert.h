// The single place where absl::Status and grpc::Status are converted into each other.
//
// Handlers return absl::Status with the canonical codes; gRPC service adapters call
// ToGrpcStatus() at the edge, and clients call FromGrpcStatus() on what a stub returned.
#ifndef PSCLUSTER_COMMON_STATUS_CONVERT_H_
#define PSCLUSTER_COMMON_STATUS_CONVERT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace pscluster {

// The message is bounded (BoundedStatusMessage): it travels in a header, and a client refuses
// headers over 8 KiB (non-ASCII bytes count three times there) with an error of its own ("metadata size exceeds limit") instead of ours.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Messages that echo what a caller sent (a 1 MiB job name, say) are cut in the middle to at most
// about kMaxStatusMessageBytes, keeping the start (what was wrong) and the end.
inline constexpr size_t kMaxStatusMessageBytes = 1024;
std::string BoundedStatusMessage(absl::string_view message);

absl::Status FromGrpcStatus(const grpc::Status& status);

// Like FromGrpcStatus, but prefixes the message with what was being called, e.g.
// "Pull to 127.0.0.1:4000: deadline exceeded" (no prefix when `context` is empty).
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view context);

// A status whose code came off the wire as a number (the TCP data plane's status frame): a code
// outside the canonical range becomes UNKNOWN instead of an enum value gRPC does not define. The
// message is prefixed with `context` as above, unless that is empty.
absl::Status StatusFromWire(uint32_t code, absl::string_view message, absl::string_view context);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_STATUS_CONVERT_H_
