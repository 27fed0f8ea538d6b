// The data-plane messages (PushChunk, PullChunk) on the wire without copying their payload:
// the encoder appends the `values` field as slices that reference the caller's memory, and the
// decoder parses every other field with protobuf while leaving `values` in the receive slices.
// The bytes are plain protobuf encoding, so any gRPC client with the generated stubs
// interoperates.
#ifndef PSCLUSTER_SERVER_WIRE_H_
#define PSCLUSTER_SERVER_WIRE_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "server/payload.h"

namespace pscluster {

inline constexpr int kPushChunkValuesField = 7;  // PushChunk.values
inline constexpr int kPullChunkValuesField = 5;  // PullChunk.values

// `header` serialised, followed by field `payload_field` holding the concatenated `payload`
// slices (omitted when empty). REQUIRES: header's own payload field is empty.
grpc::ByteBuffer EncodeWithPayload(const google::protobuf::MessageLite& header, int payload_field,
                                   std::vector<grpc::Slice> payload);

// Parses `buf` into `header` (every field except `payload_field`) and `payload` (that field's
// bytes, still in the buffer's slices). INVALID_ARGUMENT names `what` for malformed bytes.
absl::Status DecodeWithPayload(const grpc::ByteBuffer& buf, int payload_field,
                               google::protobuf::MessageLite* header, Payload* payload,
                               absl::string_view what);

// gRPC channel arguments for data-plane channels and servers (HTTP/2 windows, frame and read
// sizes for 4 MiB messages). `overrides` ("name=value;name=value") replace or add entries;
// INVALID_ARGUMENT names a malformed entry.
absl::StatusOr<std::vector<std::pair<std::string, int>>> DataPlaneChannelArgs(
    absl::string_view overrides = "");

// `payload`'s pieces as slices that share its ownership (no copy).
std::vector<grpc::Slice> PayloadSlices(const Payload& payload);

// Small messages (requests, acknowledgements): plain protobuf through one buffer.
grpc::ByteBuffer SerializeSmall(const google::protobuf::MessageLite& msg);
absl::Status ParseSmall(const grpc::ByteBuffer& buf, google::protobuf::MessageLite* msg,
                        absl::string_view what);

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_WIRE_H_
