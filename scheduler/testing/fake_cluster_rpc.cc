#include "scheduler/testing/fake_cluster_rpc.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pscluster::scheduler::testing {
namespace {

// The request a FenceWorker, LeaveJob or RejoinJob call stands for.
v1::FenceWorkerRequest Fence(const std::string& job_id, uint32_t worker, uint32_t attempt,
                             bool leave, bool rejoin) {
  v1::FenceWorkerRequest f;
  f.set_job_id(job_id);
  f.set_worker(worker);
  f.set_attempt(attempt);
  f.set_leave(leave);
  f.set_rejoin(rejoin);
  return f;
}

}  // namespace

void FakeClusterRpc::SetDown(const std::string& address, absl::Status status) {
  absl::MutexLock l(&mu_);
  nodes_[address].down = std::move(status);
}

void FakeClusterRpc::FailNext(const std::string& address, const std::string& method,
                              absl::Status status, int times) {
  absl::MutexLock l(&mu_);
  auto& queue = nodes_[address].fail_next[method];
  for (int i = 0; i < times; ++i) queue.push_back(status);
}

void FakeClusterRpc::SetClocks(const std::string& address, const std::string& job_id,
                               std::vector<int64_t> clocks) {
  absl::MutexLock l(&mu_);
  nodes_[address].clocks[job_id] = std::move(clocks);
}

void FakeClusterRpc::SetTableBytes(const std::string& address, const std::string& job_id,
                                   uint64_t bytes) {
  absl::MutexLock l(&mu_);
  nodes_[address].bytes[job_id] = bytes;
}

void FakeClusterRpc::FinishTask(const std::string& address) {
  absl::MutexLock l(&mu_);
  nodes_[address].busy = false;
}

std::vector<FakeClusterRpc::Call> FakeClusterRpc::calls() const {
  absl::MutexLock l(&mu_);
  return calls_;
}

std::vector<std::string> FakeClusterRpc::CallsOf(const std::string& method) const {
  absl::MutexLock l(&mu_);
  std::vector<std::string> out;
  for (const Call& c : calls_) {
    if (c.method == method) out.push_back(c.address);
  }
  return out;
}

std::vector<v1::AssignTaskRequest> FakeClusterRpc::assigned(const std::string& address) const {
  absl::MutexLock l(&mu_);
  auto it = nodes_.find(address);
  return it == nodes_.end() ? std::vector<v1::AssignTaskRequest>{} : it->second.assigned;
}

std::vector<v1::UpdateShardMapRequest> FakeClusterRpc::map_updates(
    const std::string& address) const {
  absl::MutexLock l(&mu_);
  auto it = nodes_.find(address);
  return it == nodes_.end() ? std::vector<v1::UpdateShardMapRequest>{} : it->second.map_updates;
}

std::vector<v1::FenceWorkerRequest> FakeClusterRpc::fences(const std::string& address) const {
  absl::MutexLock l(&mu_);
  auto it = nodes_.find(address);
  return it == nodes_.end() ? std::vector<v1::FenceWorkerRequest>{} : it->second.fences;
}

bool FakeClusterRpc::Holds(const std::string& address, const std::string& job_id) const {
  absl::MutexLock l(&mu_);
  auto it = nodes_.find(address);
  return it != nodes_.end() && it->second.jobs.contains(job_id);
}

bool FakeClusterRpc::Busy(const std::string& address) const {
  absl::MutexLock l(&mu_);
  auto it = nodes_.find(address);
  return it != nodes_.end() && it->second.busy;
}

absl::Status FakeClusterRpc::Enter(const std::string& method, const std::string& address,
                                   const std::string& job_id) {
  calls_.push_back(Call{method, address, job_id});
  Node& node = nodes_[address];
  if (!node.down.ok()) {
    return absl::Status(node.down.code(), absl::StrCat(address, ": ", node.down.message()));
  }
  auto it = node.fail_next.find(method);
  if (it != node.fail_next.end() && !it->second.empty()) {
    absl::Status s = it->second.front();
    it->second.erase(it->second.begin());
    return absl::Status(s.code(), absl::StrCat(address, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> FakeClusterRpc::ClockOf(Node& node, const std::string& address,
                                                const std::string& job_id, uint32_t worker) {
  auto it = node.clocks.find(job_id);
  if (it == node.clocks.end() || worker >= it->second.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat(address, ": no clock of worker ", worker, " of job ", job_id));
  }
  return it->second[worker];
}

absl::Status FakeClusterRpc::UpdateShardMap(const std::string& address,
                                            const v1::UpdateShardMapRequest& request) {
  absl::MutexLock l(&mu_);
  absl::Status s = Enter("UpdateShardMap", address, request.map().job_id());
  if (!s.ok()) return s;
  Node& node = nodes_[address];
  node.map_updates.push_back(request);
  JobOnServer& job = node.jobs[request.map().job_id()];
  if (request.map().epoch() > job.map.epoch()) job.map = request.map();
  return absl::OkStatus();
}

absl::Status FakeClusterRpc::DropJob(const std::string& address, const std::string& job_id) {
  absl::MutexLock l(&mu_);
  absl::Status s = Enter("DropJob", address, job_id);
  if (!s.ok()) return s;
  nodes_[address].jobs.erase(job_id);
  return absl::OkStatus();
}

absl::Status FakeClusterRpc::CreateTables(const std::string& address,
                                          const v1::CreateTablesRequest& request) {
  absl::MutexLock l(&mu_);
  absl::Status s = Enter("CreateTables", address, request.job_id());
  if (!s.ok()) return s;
  JobOnServer& job = nodes_[address].jobs[request.job_id()];
  job.tables.assign(request.tables().begin(), request.tables().end());
  return absl::OkStatus();
}

absl::StatusOr<v1::ServerStatus> FakeClusterRpc::ServerStatus(const std::string& address,
                                                              const std::string& job_id) {
  absl::MutexLock l(&mu_);
  absl::Status s = Enter("ServerStatus", address, job_id);
  if (!s.ok()) return s;
  Node& node = nodes_[address];
  v1::ServerStatus st;
  st.set_address(address);
  for (const auto& [id, job] : node.jobs) {
    if (!job_id.empty() && id != job_id) continue;
    v1::JobOnServer* j = st.add_jobs();
    j->set_job_id(id);
    j->set_epoch(job.map.epoch());
    auto clocks = node.clocks.find(id);
    if (clocks != node.clocks.end() && !clocks->second.empty()) {
      for (size_t w = 0; w < clocks->second.size(); ++w) {
        v1::WorkerClock* c = j->add_clocks();
        c->set_worker(w);
        c->set_clock(clocks->second[w]);
      }
      j->set_min_clock(*std::min_element(clocks->second.begin(), clocks->second.end()));
      j->set_max_clock(*std::max_element(clocks->second.begin(), clocks->second.end()));
    }
    for (const v1::TableSpec& t : job.tables) {
      v1::TableStatus* ts = j->add_tables();
      ts->set_name(t.name());
      ts->set_kind(t.kind());
      *ts->mutable_spec() = t;
    }
    auto bytes = node.bytes.find(id);
    if (bytes != node.bytes.end()) {
      v1::TableStatus* ts = j->add_tables();
      ts->set_name("memory");
      ts->set_kind(v1::DENSE);
      ts->set_bytes(bytes->second);
    }
  }
  return st;
}

absl::StatusOr<v1::CheckpointResponse> FakeClusterRpc::Checkpoint(const std::string& address,
                                                                  const std::string& job_id,
                                                                  const std::string& dir) {
  absl::MutexLock l(&mu_);
  absl::Status s = Enter("Checkpoint", address, job_id);
  if (!s.ok()) return s;
  if (!nodes_[address].jobs.contains(job_id)) {
    return absl::NotFoundError(absl::StrCat(address, ": no job ", job_id));
  }
  v1::CheckpointResponse r;
  r.set_path(absl::StrCat(dir, "/", job_id, "/fake.ckpt"));
  return r;
}

absl::StatusOr<int64_t> FakeClusterRpc::FenceWorker(const std::string& address,
                                                    const std::string& job_id, uint32_t worker,
                                                    uint32_t attempt) {
  absl::MutexLock l(&mu_);
  absl::Status s = Enter("FenceWorker", address, job_id);
  if (!s.ok()) return s;
  Node& node = nodes_[address];
  node.fences.push_back(Fence(job_id, worker, attempt, false, false));
  return ClockOf(node, address, job_id, worker);
}

absl::StatusOr<int64_t> FakeClusterRpc::LeaveJob(const std::string& address,
                                                 const std::string& job_id, uint32_t worker) {
  absl::MutexLock l(&mu_);
  absl::Status s = Enter("LeaveJob", address, job_id);
  if (!s.ok()) return s;
  Node& node = nodes_[address];
  node.fences.push_back(Fence(job_id, worker, 0, true, false));
  return ClockOf(node, address, job_id, worker);
}

absl::StatusOr<int64_t> FakeClusterRpc::RejoinJob(const std::string& address,
                                                  const std::string& job_id, uint32_t worker,
                                                  uint32_t attempt) {
  absl::MutexLock l(&mu_);
  absl::Status s = Enter("RejoinJob", address, job_id);
  if (!s.ok()) return s;
  Node& node = nodes_[address];
  node.fences.push_back(Fence(job_id, worker, attempt, false, true));
  auto it = node.clocks.find(job_id);
  if (it == node.clocks.end() || it->second.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(address, ": no clocks of job ", job_id));
  }
  return *std::min_element(it->second.begin(), it->second.end());
}

absl::Status FakeClusterRpc::AssignTask(const std::string& address,
                                        const v1::AssignTaskRequest& request) {
  absl::MutexLock l(&mu_);
  absl::Status s = Enter("AssignTask", address, request.job_id());
  if (!s.ok()) return s;
  Node& node = nodes_[address];
  if (node.busy) {
    return absl::FailedPreconditionError(absl::StrCat(address, ": busy with job ",
                                                      node.task.job_id(), " rank ",
                                                      node.task.rank()));
  }
  node.busy = true;
  node.task = request;
  node.assigned.push_back(request);
  return absl::OkStatus();
}

absl::Status FakeClusterRpc::StopTask(const std::string& address, const std::string& job_id,
                                      const std::string& reason) {
  absl::MutexLock l(&mu_);
  absl::Status s = Enter("StopTask", address, job_id);
  if (!s.ok()) return s;
  Node& node = nodes_[address];
  if (node.busy && node.task.job_id() == job_id) node.busy = false;
  return absl::OkStatus();
}

absl::Status FakeClusterRpc::UpdateWorkerShardMap(const std::string& address,
                                                  const v1::ShardMap& map) {
  absl::MutexLock l(&mu_);
  return Enter("UpdateWorkerShardMap", address, map.job_id());
}

absl::StatusOr<v1::WorkerStatus> FakeClusterRpc::WorkerStatus(const std::string& address) {
  absl::MutexLock l(&mu_);
  absl::Status s = Enter("WorkerStatus", address, "");
  if (!s.ok()) return s;
  const Node& node = nodes_[address];
  v1::WorkerStatus st;
  st.set_busy(node.busy);
  st.set_job_id(node.task.job_id());
  st.set_rank(node.task.rank());
  st.set_attempt(node.task.attempt());
  return st;
}

absl::Status FakeClusterRpc::UpdatePartition(const std::string& address,
                                             const v1::UpdatePartitionRequest& request) {
  absl::MutexLock l(&mu_);
  return Enter("UpdatePartition", address, request.job_id());
}

absl::StatusOr<v1::ExportModelResponse> FakeClusterRpc::ExportModel(
    const std::string& address, const v1::ExportModelRequest& request, absl::Duration) {
  absl::MutexLock l(&mu_);
  absl::Status s = Enter("ExportModel", address, request.job_id());
  if (!s.ok()) return s;
  v1::ExportModelResponse r;
  r.set_path(request.path());
  return r;
}

absl::StatusOr<v1::TaskLogsResponse> FakeClusterRpc::GetTaskLogs(
    const std::string& address, const v1::TaskLogsRequest& request) {
  absl::MutexLock l(&mu_);
  absl::Status s = Enter("GetTaskLogs", address, request.job_id());
  if (!s.ok()) return s;
  return v1::TaskLogsResponse();
}

}  // namespace pscluster::scheduler::testing
