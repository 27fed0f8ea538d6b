// Where each field of a job spec came from, so that validation errors can name the file, line
// and field: "job.yaml:12: consistency.staleness: must be >= 0".
#ifndef PSCLUSTER_SCHEDULER_JOB_SOURCE_H_
#define PSCLUSTER_SCHEDULER_JOB_SOURCE_H_

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pscluster::scheduler {

class JobSource {
 public:
  // `name` is the file name shown in errors ("job.yaml"); empty = "job spec".
  explicit JobSource(std::string name = "");

  const std::string& name() const { return name_; }

  // Records that field `path` ("model.hidden[1]", "table_optimizers[fc1.w].learning_rate") was
  // written on 1-based line `line` (ignored when <= 0).
  void SetLine(absl::string_view path, int line);

  // Line of `path`, or of its nearest enclosing field that has one; 0 when none does.
  int LineOf(absl::string_view path) const;

  // INVALID_ARGUMENT "<name>:<line>: <path>: <message>" (no ":<line>" when unknown, no
  // "<path>: " when `path` is empty).
  absl::Status Error(absl::string_view path, absl::string_view message) const;
  // Same, with an explicit line (for errors about YAML structure, before a path is known).
  absl::Status ErrorAtLine(int line, absl::string_view path, absl::string_view message) const;

 private:
  std::string name_;
  absl::flat_hash_map<std::string, int> lines_;
};

// The parent of a field path: "a.b[3]" -> "a.b", "a.b" -> "a", "a" -> "".
std::string ParentPath(absl::string_view path);

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_JOB_SOURCE_H_
