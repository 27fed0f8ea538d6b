// How psctl prints: aligned tables for people, JSON or YAML of the scheduler's messages for
// scripts (field names as in proto/*.proto, every field present).
#ifndef PSCLUSTER_SCHEDULER_PSCTL_FORMAT_H_
#define PSCLUSTER_SCHEDULER_PSCTL_FORMAT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "proto/scheduler.pb.h"

namespace pscluster::psctl {

enum class OutputFormat { kTable, kJson, kYaml };

// "table", "json" or "yaml"; INVALID_ARGUMENT naming -o otherwise.
absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text);

std::string ToJson(const google::protobuf::Message& msg);
std::string ToYaml(const google::protobuf::Message& msg);

// Left-aligned columns separated by two spaces; the first row is the header.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string ToString() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// "[#########...........]  45%".
std::string ProgressBar(double fraction, int width = 30);
// 0.4 -> "0.4s", 75 -> "1m15s", 7300 -> "2h01m"; negative = "-".
std::string HumanDuration(double seconds);
// "12.3 MB/s", "512 B".
std::string HumanBytes(double bytes);

std::string JobsTable(const v1::ListJobsResponse& jobs, int64_t now_unix_ms);
// A job in full: state, progress bar, metrics, placement and one line per worker. `nodes` name
// the addresses of its servers and workers.
std::string JobDetail(const v1::Job& job, const std::vector<v1::NodeStatus>& nodes,
                      int64_t now_unix_ms);
// One line for live views: state, bar, step, epoch, loss, accuracies, throughput, ETA.
std::string JobLine(const v1::Job& job);
std::string NodesTable(const v1::ClusterStatusResponse& status);
std::string ShardsTable(const v1::ShardMap& map, const std::vector<v1::ShardLoad>& loads);
// A job's history (Job.history) for humans: its events, and at most `max_rows` of its progress
// points, spread evenly over the run (the first and the latest always among them).
std::string HistoryText(const v1::Job& job, int max_rows = 25);

}  // namespace pscluster::psctl

#endif  // PSCLUSTER_SCHEDULER_PSCTL_FORMAT_H_
