// Job files: YAML text -> JobSpec (and back, for display).
//
// Keys are the field names of pscluster.v1.JobSpec and its nested messages (proto/job.proto);
// see deploy/examples/*.yaml. Enum values are written by name, case-insensitively, with or
// without their prefix ("adam", "bsp", "float16" or "DT_FLOAT16"). Unknown keys, duplicate keys,
// wrong types and out-of-range numbers are errors that name the file, line and field.
#ifndef PSCLUSTER_SCHEDULER_JOB_YAML_H_
#define PSCLUSTER_SCHEDULER_JOB_YAML_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "proto/job.pb.h"
#include "scheduler/job_source.h"

namespace pscluster::scheduler {

// Parses `text` into `*spec` (only structure and types; see ValidateJobSpec for the rules) and
// records each field's line in `*where`. Errors are INVALID_ARGUMENT with "<file>:<line>: ...".
absl::Status ParseJobYaml(absl::string_view text, v1::JobSpec* spec, JobSource* where);

// Generic form used by ParseJobYaml: YAML text into any message.
absl::Status ParseYamlInto(absl::string_view text, google::protobuf::Message* msg,
                           JobSource* where);

// Parse, fill defaults and validate: what SubmitJob does with a job file.
absl::StatusOr<v1::JobSpec> LoadJobYaml(absl::string_view text, const std::string& source);

// The spec as YAML in the job-file format (enum names lower-case, default values left out).
std::string JobSpecToYaml(const v1::JobSpec& spec);

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_JOB_YAML_H_
