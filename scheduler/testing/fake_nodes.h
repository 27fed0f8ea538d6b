// Stand-ins for ps_server and ps_worker in scheduler tests: real gRPC services on loopback that
// implement the calls the scheduler makes (ParameterServer.UpdateShardMap/DropJob/Status,
// WorkerControl.*), record what they received, and — for workers — simulate a training task by
// reporting progress to the scheduler over gRPC. A FakeNode also registers and heartbeats like a
// real daemon. They train nothing: the reported numbers are configured, not computed.
#ifndef PSCLUSTER_SCHEDULER_TESTING_FAKE_NODES_H_
#define PSCLUSTER_SCHEDULER_TESTING_FAKE_NODES_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_server.h"
#include "proto/ps.grpc.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "proto/worker.grpc.pb.h"

namespace pscluster::scheduler::testing {

// What a fake worker reports while it "trains".
struct SimulatedTraining {
  int64_t total_steps = 20;
  absl::Duration step_time = absl::Milliseconds(10);
  int report_every = 5;            // Steps between progress reports.
  int64_t fail_at_step = -1;       // Report `error` at this step (-1 = never).
  std::string error = "simulated failure";
  double test_accuracy = 0.9;      // Reported with the final report.
  std::string export_dir;          // The lead rank (0 unless told otherwise) reports
                                   // <export_dir>/<job_id>.safetensors when done
                                   // (the spec's export_path when set).
  bool run = true;                 // false: accept tasks but report nothing.
};

class FakeParameterServer final : public v1::ParameterServer::CallbackService {
 public:
  grpc::ServerUnaryReactor* UpdateShardMap(grpc::CallbackServerContext* ctx,
                                           const v1::UpdateShardMapRequest* req,
                                           v1::UpdateShardMapResponse* resp) override;
  grpc::ServerUnaryReactor* DropJob(grpc::CallbackServerContext* ctx,
                                    const v1::DropJobRequest* req,
                                    v1::DropJobResponse* resp) override;
  // Records the request; Status reports its tables (specs) from then on.
  grpc::ServerUnaryReactor* CreateTables(grpc::CallbackServerContext* ctx,
                                         const v1::CreateTablesRequest* req,
                                         v1::CreateTablesResponse* resp) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const v1::ServerStatusRequest* req,
                                   v1::ServerStatus* resp) override;
  // Records the request; answers <dir>/<job_id>/fake-step0.ckpt.
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* ctx,
                                       const v1::CheckpointRequest* req,
                                       v1::CheckpointResponse* resp) override;
  // Records the fence; answers the worker's clock of SetClocks (FAILED_PRECONDITION when none
  // was set, as a server that cannot say where the rank stands).
  grpc::ServerUnaryReactor* FenceWorker(grpc::CallbackServerContext* ctx,
                                        const v1::FenceWorkerRequest* req,
                                        v1::FenceWorkerResponse* resp) override;

  // Makes UpdateShardMap fail with `status` (OK = succeed again).
  void FailUpdates(grpc::Status status);
  // Ranks reported in Status as holding parked pulls back.
  void SetWaitingFor(std::vector<uint32_t> ranks);
  // Clocks reported in Status, by worker (none by default).
  void SetClocks(std::vector<int64_t> clocks);
  // Status reports these backups (addresses) as ones this primary cannot deliver copies to.
  void SetUnreachableBackups(std::vector<std::string> addresses);
  // Status reports a live copy of `primary`'s shards here, caught up or not.
  void SetCopyOf(const std::string& primary, bool caught_up);
  // Status reports a caught-up live copy of every primary its last map's copy_from names.
  void SetAllCopiesCaughtUp(bool on);

  std::vector<v1::UpdateShardMapRequest> updates() const;
  // When the map of `epoch` arrived, as a sequence number shared by every fake server of the
  // process (later is larger); 0 when it did not.
  uint64_t UpdateOrder(uint64_t epoch) const;
  std::vector<std::string> dropped() const;
  std::vector<v1::CreateTablesRequest> created() const;
  std::vector<v1::FenceWorkerRequest> fences() const;
  std::vector<v1::CheckpointRequest> checkpoints() const;

 private:
  mutable absl::Mutex mu_;
  grpc::Status fail_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> waiting_for_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> clocks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> unreachable_ ABSL_GUARDED_BY(mu_);
  std::string copy_of_ ABSL_GUARDED_BY(mu_);
  bool copy_caught_up_ ABSL_GUARDED_BY(mu_) = false;
  bool all_caught_up_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<v1::UpdateShardMapRequest> updates_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> update_order_ ABSL_GUARDED_BY(mu_);  // Of each of updates_.
  std::vector<std::string> dropped_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::CreateTablesRequest> created_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::FenceWorkerRequest> fences_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::CheckpointRequest> checkpoints_ ABSL_GUARDED_BY(mu_);
};

class FakeWorker final : public v1::WorkerControl::CallbackService {
 public:
  // `scheduler_address` receives the progress reports ("" = none are sent).
  FakeWorker(std::string scheduler_address, SimulatedTraining training);
  ~FakeWorker() override;

  grpc::ServerUnaryReactor* AssignTask(grpc::CallbackServerContext* ctx,
                                       const v1::AssignTaskRequest* req,
                                       v1::AssignTaskResponse* resp) override;
  grpc::ServerUnaryReactor* StopTask(grpc::CallbackServerContext* ctx,
                                     const v1::StopTaskRequest* req,
                                     v1::StopTaskResponse* resp) override;
  grpc::ServerUnaryReactor* UpdateShardMap(grpc::CallbackServerContext* ctx,
                                           const v1::WorkerShardMapRequest* req,
                                           v1::WorkerShardMapResponse* resp) override;
  // Records the change; the lead rank it names exports when done.
  grpc::ServerUnaryReactor* UpdatePartition(grpc::CallbackServerContext* ctx,
                                            const v1::UpdatePartitionRequest* req,
                                            v1::UpdatePartitionResponse* resp) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const v1::WorkerStatusRequest* req,
                                   v1::WorkerStatus* resp) override;

  void set_node_id(const std::string& id);
  std::vector<v1::UpdatePartitionRequest> partition_updates() const;
  std::vector<v1::AssignTaskRequest> assigned() const;
  std::vector<v1::StopTaskRequest> stopped() const;
  bool busy() const;
  // Ends the current task as if it had finished (for workers that do not simulate training).
  void FinishTask();
  // With `hold`, StopTask is acknowledged but the task stays busy until FinishTask() (a task
  // that takes a while to stop).
  void HoldOnStop(bool hold);
  // Waits for the simulated task to end.
  void JoinTask();

 private:
  void Train(v1::AssignTaskRequest task);

  const std::string scheduler_address_;
  const SimulatedTraining training_;
  mutable absl::Mutex mu_;
  std::string node_id_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  uint32_t rank_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t attempt_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t lead_rank_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::UpdatePartitionRequest> partition_updates_ ABSL_GUARDED_BY(mu_);
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_on_stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<v1::AssignTaskRequest> assigned_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::StopTaskRequest> stopped_ ABSL_GUARDED_BY(mu_);
  std::thread task_;
};

struct FakeNodeOptions {
  v1::NodeRole role = v1::ROLE_WORKER;
  std::string scheduler_address;         // Registers and heartbeats here ("" = it does not).
  std::string listen_address = "127.0.0.1:0";
  std::string port_file;
  v1::Resources capacity;
  absl::Duration heartbeat_interval = absl::Milliseconds(100);
  SimulatedTraining training;            // Workers only.
};

// A whole stand-in daemon: gRPC server (with health) on its own port, registration, heartbeats.
class FakeNode {
 public:
  static absl::StatusOr<std::unique_ptr<FakeNode>> Start(const FakeNodeOptions& options);
  ~FakeNode();

  // Deregisters and stops.
  void Stop();
  // Stops like a killed process: no deregistration, heartbeats and service just end.
  void Crash();
  // Stops heartbeating but keeps serving (a paused or partitioned node).
  void PauseHeartbeats();

  const std::string& address() const { return server_->address(); }
  std::string node_id() const;
  // Waits until the node has registered (an id) or `timeout` passes.
  bool WaitRegistered(absl::Duration timeout) const;
  FakeParameterServer* server() { return ps_.get(); }
  FakeWorker* worker() { return worker_.get(); }

 private:
  FakeNode() = default;
  void HeartbeatLoop();

  FakeNodeOptions options_;
  std::unique_ptr<FakeParameterServer> ps_;
  std::unique_ptr<FakeWorker> worker_;
  std::unique_ptr<GrpcServer> server_;
  mutable absl::Mutex mu_;
  std::string node_id_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  std::thread heartbeats_;
  bool stopped_ = false;
};

}  // namespace pscluster::scheduler::testing

#endif  // PSCLUSTER_SCHEDULER_TESTING_FAKE_NODES_H_
