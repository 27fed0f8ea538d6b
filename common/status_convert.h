// The single place where absl::Status and grpc::Status are converted into each other.
//
// Handlers return absl::Status with the canonical codes; gRPC service adapters call
// ToGrpcStatus() at the edge, and clients call FromGrpcStatus() on what a stub returned.
#ifndef PSCLUSTER_COMMON_STATUS_CONVERT_H_
#define PSCLUSTER_COMMON_STATUS_CONVERT_H_

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace pscluster {

grpc::Status ToGrpcStatus(const absl::Status& status);

absl::Status FromGrpcStatus(const grpc::Status& status);

// Like FromGrpcStatus, but prefixes the message with what was being called, e.g.
// "Pull to 127.0.0.1:4000: deadline exceeded".
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view context);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_STATUS_CONVERT_H_
