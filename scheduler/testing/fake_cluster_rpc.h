// FakeClusterRpc: the calls the scheduler makes to servers and workers (cluster_rpc.h), answered
// in memory by plain per-address state instead of daemons behind sockets. Tests of the
// scheduler's passes drive RunOnce() with a FakeClock against it, inject failures per address
// and per method, and read back every call in the order it was made. Addresses are only names
// here: nothing is dialed.
//
// What it models, as the real daemons answer:
//  * a server holds, per job, the last shard map it was given (UpdateShardMap), the tables it
//    was asked to create, and the clocks set by the test; DropJob forgets the job; ServerStatus
//    reports the jobs it holds with their epoch and clocks; FenceWorker and LeaveJob answer the
//    rank's clock (FAILED_PRECONDITION when the test set none, as a server that cannot say where
//    the rank stands); RejoinJob answers the slowest clock;
//  * a worker runs at most one task: AssignTask makes it busy (FAILED_PRECONDITION when it is),
//    StopTask and FinishTask end it; WorkerStatus reports it.
#ifndef PSCLUSTER_SCHEDULER_TESTING_FAKE_CLUSTER_RPC_H_
#define PSCLUSTER_SCHEDULER_TESTING_FAKE_CLUSTER_RPC_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "scheduler/cluster_rpc.h"

namespace pscluster::scheduler::testing {

class FakeClusterRpc final : public ClusterRpc {
 public:
  // One call as made: method name, address, and the job it was about ("" for WorkerStatus).
  struct Call {
    std::string method;
    std::string address;
    std::string job_id;
  };

  // Every call to `address` fails with `status` (UNAVAILABLE for a node that is gone); OK
  // answers again. Failed calls are recorded too.
  void SetDown(const std::string& address, absl::Status status);
  // The next `times` calls of `method` (e.g. "AssignTask") to `address` fail with `status`.
  void FailNext(const std::string& address, const std::string& method, absl::Status status,
                int times = 1);
  // Server `address`'s clock of each rank of `job_id`.
  void SetClocks(const std::string& address, const std::string& job_id,
                 std::vector<int64_t> clocks);
  // Server `address` reports `bytes` of parameters and optimizer state for `job_id` in its
  // ServerStatus (as the bytes of one more table, "memory").
  void SetTableBytes(const std::string& address, const std::string& job_id, uint64_t bytes);
  // Worker `address`'s task ends as if it had finished.
  void FinishTask(const std::string& address);

  std::vector<Call> calls() const;
  // The addresses `method` was called on, in order (failed calls included).
  std::vector<std::string> CallsOf(const std::string& method) const;
  // What worker `address` was assigned / server `address` was sent, in order.
  std::vector<v1::AssignTaskRequest> assigned(const std::string& address) const;
  std::vector<v1::UpdateShardMapRequest> map_updates(const std::string& address) const;
  std::vector<v1::FenceWorkerRequest> fences(const std::string& address) const;
  // Whether server `address` holds `job_id` (given a map and not dropped since).
  bool Holds(const std::string& address, const std::string& job_id) const;
  bool Busy(const std::string& address) const;

  // ClusterRpc.
  absl::Status UpdateShardMap(const std::string& address,
                              const v1::UpdateShardMapRequest& request) override;
  absl::Status DropJob(const std::string& address, const std::string& job_id) override;
  absl::Status CreateTables(const std::string& address,
                            const v1::CreateTablesRequest& request) override;
  absl::StatusOr<v1::ServerStatus> ServerStatus(const std::string& address,
                                                const std::string& job_id) override;
  absl::StatusOr<v1::CheckpointResponse> Checkpoint(const std::string& address,
                                                    const std::string& job_id,
                                                    const std::string& dir) override;
  absl::StatusOr<int64_t> FenceWorker(const std::string& address, const std::string& job_id,
                                      uint32_t worker, uint32_t attempt) override;
  absl::StatusOr<int64_t> LeaveJob(const std::string& address, const std::string& job_id,
                                   uint32_t worker) override;
  absl::StatusOr<int64_t> RejoinJob(const std::string& address, const std::string& job_id,
                                    uint32_t worker, uint32_t attempt) override;
  absl::Status AssignTask(const std::string& address,
                          const v1::AssignTaskRequest& request) override;
  absl::Status StopTask(const std::string& address, const std::string& job_id,
                        const std::string& reason) override;
  absl::Status UpdateWorkerShardMap(const std::string& address, const v1::ShardMap& map) override;
  absl::StatusOr<v1::WorkerStatus> WorkerStatus(const std::string& address) override;
  absl::Status UpdatePartition(const std::string& address,
                               const v1::UpdatePartitionRequest& request) override;
  absl::StatusOr<v1::ExportModelResponse> ExportModel(const std::string& address,
                                                      const v1::ExportModelRequest& request,
                                                      absl::Duration timeout) override;
  absl::StatusOr<v1::TaskLogsResponse> GetTaskLogs(const std::string& address,
                                                   const v1::TaskLogsRequest& request) override;

 private:
  struct JobOnServer {
    v1::ShardMap map;
    std::vector<v1::TableSpec> tables;
    std::vector<int64_t> clocks;
  };
  struct Node {
    absl::Status down;
    absl::flat_hash_map<std::string, std::vector<absl::Status>> fail_next;  // By method.
    // Server side.
    absl::flat_hash_map<std::string, JobOnServer> jobs;
    absl::flat_hash_map<std::string, std::vector<int64_t>> clocks;  // Set by the test, by job.
    absl::flat_hash_map<std::string, uint64_t> bytes;  // Set by the test, by job.
    std::vector<v1::UpdateShardMapRequest> map_updates;
    std::vector<v1::FenceWorkerRequest> fences;
    // Worker side.
    bool busy = false;
    v1::AssignTaskRequest task;
    std::vector<v1::AssignTaskRequest> assigned;
  };

  // Records the call and answers the failure the test injected for it (OK: none).
  absl::Status Enter(const std::string& method, const std::string& address,
                     const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The clock server `address` has of `worker` in `job_id`, as FenceWorker answers it.
  absl::StatusOr<int64_t> ClockOf(Node& node, const std::string& address,
                                  const std::string& job_id, uint32_t worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Node> nodes_ ABSL_GUARDED_BY(mu_);
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::scheduler::testing

#endif  // PSCLUSTER_SCHEDULER_TESTING_FAKE_CLUSTER_RPC_H_
