// Enum fields checked against the values their .proto declares, for any message, driven by the
// descriptors: a proto3 enum field keeps whatever number arrives on the wire, so a request with
// `consistency.mode: 7` parses fine and would otherwise travel on until something switches on
// it. A new enum field anywhere in a request is covered without new code.
#ifndef PSCLUSTER_COMMON_VALIDATE_ENUMS_H_
#define PSCLUSTER_COMMON_VALIDATE_ENUMS_H_

#include "absl/status/status.h"
#include "google/protobuf/message.h"

namespace pscluster {

// OK when every enum value set in `message` (nested messages, repeated fields and maps
// included) is one its enum declares. Otherwise INVALID_ARGUMENT naming the first bad field by
// its path and the enum, e.g. "job.tables[1].optimizer.kind: 42 is not a value of
// pscluster.v1.OptimizerSpec.Kind (SGD, MOMENTUM, ...)".
absl::Status ValidateEnums(const google::protobuf::Message& message);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_VALIDATE_ENUMS_H_
