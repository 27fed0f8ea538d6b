// ps_scheduler with its state in etcd, one of several: each instance campaigns for the leadership
// (leader_election.h). The leader runs the whole scheduler (SchedulerDaemon over an EtcdStore
// fenced by its term, its calls to servers and workers carrying that term:
// common/scheduler_term.h). A follower listens on the same port: it answers GetJob, ListJobs and
// GetShardMap from what the leader last wrote to etcd (read again when older than a second),
// every other Scheduler call with UNAVAILABLE naming the leader, and reports NOT_SERVING to
// grpc.health.v1, so that clients given every scheduler's address (common/channel.h) send their
// calls to the leader only.
//
// A leader that loses the leadership (its lease not renewed in time, etcd unreachable, another
// leader's term found on a write) stops its scheduler and campaigns again as a follower. A new
// leader restores jobs, nodes and shard maps from etcd, as a scheduler restarted on its SQLite
// file does; servers and workers carry on under their node ids.
//
// Thread model: one election thread; Shutdown() from any thread.
#ifndef PSCLUSTER_SCHEDULER_HA_SCHEDULER_H_
#define PSCLUSTER_SCHEDULER_HA_SCHEDULER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/authz.h"
#include "grpcpp/server.h"
#include "scheduler/etcd_client.h"
#include "common/metrics.h"
#include "grpcpp/channel.h"
#include "scheduler/etcd_store.h"
#include "scheduler/leader_election.h"
#include "scheduler/scheduler_daemon.h"
#include "scheduler/status_http.h"

namespace pscluster::scheduler {

struct HaOptions {
  std::string etcd_endpoints;         // host:port[,host:port...] of the etcd members.
  std::string prefix = "/pscluster";  // Key prefix of this cluster's state in etcd.
  int64_t lease_seconds = 5;          // Leadership lease.
  // host:port clients reach this scheduler at, told to callers by followers ("" = the address
  // it listens on, with 0.0.0.0 read as 127.0.0.1).
  std::string advertise_address;
  absl::Duration etcd_timeout = absl::Seconds(2);  // Deadline of each etcd call.
  // TLS to the etcd members (--etcd_ca_file, --etcd_cert_file, --etcd_key_file); none: plain.
  TlsFiles etcd_tls;
};

class HaScheduler {
 public:
  // Connects to etcd, starts listening as a follower (the port file is written then) and starts
  // campaigning. Errors name the flag at fault.
  static absl::StatusOr<std::unique_ptr<HaScheduler>> Start(const SchedulerDaemonOptions& daemon,
                                                            const HaOptions& ha);
  ~HaScheduler();

  // Stops the scheduler (if leading), resigns and stops listening.
  void Shutdown();

  bool leading() const;
  // The address this scheduler listens on.
  const std::string& address() const { return address_; }
  // The current leader's advertised address as last seen ("" = none known).
  std::string leader() const { return election_->leader(); }
  // The port of /metrics (--metrics_listen; 0 = none): the leading scheduler's, or while
  // following, the follower's own (pscluster_scheduler_leading 0), so that every scheduler
  // answers a scrape.
  int metrics_port() const;
  // The port of the status page (--http_listen; 0 = none): the leading scheduler's, or while
  // following, the follower's own, whose data the leader answers (ClusterStatus, with the
  // caller's token) and the follower's view of etcd (shard maps).
  int http_port() const;
  // SIGHUP: rereads the token and quota files of a leading scheduler (a follower reads them when
  // it takes over).
  absl::Status Reload();

 private:
  class FollowerService;
  class FollowerStatusSource;
  struct View;
  // How old a follower's view of etcd may be when it answers a read.
  static constexpr absl::Duration kViewMaxAge = absl::Seconds(1);

  HaScheduler() = default;
  // The Authorization metadata of a call a follower makes to the leader for a caller: the
  // caller's own (`caller`, the header it sent; the schedulers share one token file), else this
  // scheduler's --credential_file token ("" = none).
  std::string LeaderAuthorization(const std::string& caller) const;
  // A follower's answer to a call it does not serve.
  std::string NotLeaderMessage() const;
  // The follower's view of etcd, read again when older than kViewMaxAge.
  absl::StatusOr<std::shared_ptr<View>> CurrentView();
  // A follower's channel to the leader (made again when the leader changes); UNAVAILABLE with
  // NotLeaderMessage() when no other scheduler is known to lead.
  absl::StatusOr<std::shared_ptr<grpc::Channel>> LeaderChannel();
  absl::Status StartFollowerServer();
  void StopFollowerServer();
  void Run();

  SchedulerDaemonOptions daemon_options_;
  HaOptions ha_;
  std::string address_;
  std::string advertise_;
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<LeaderElection> election_;
  std::unique_ptr<Authorizer> authz_;  // The follower's (the leader's daemon has its own).
  std::unique_ptr<FollowerService> follower_service_;
  // Set once the fields above are (the follower server answers calls before).
  absl::Notification ready_;
  absl::Mutex view_mu_;
  std::shared_ptr<View> view_ ABSL_GUARDED_BY(view_mu_);
  std::string leader_address_ ABSL_GUARDED_BY(view_mu_);  // Of leader_channel_.
  std::shared_ptr<grpc::Channel> leader_channel_ ABSL_GUARDED_BY(view_mu_);
  std::unique_ptr<grpc::Server> follower_server_;
  // A follower's /metrics (on --metrics_listen while it follows; the leader's daemon serves its
  // own there).
  MetricsRegistry follower_metrics_;
  std::unique_ptr<MetricsHttpServer> follower_metrics_server_ ABSL_GUARDED_BY(mu_);
  // A follower's status page (on --http_listen while it follows).
  std::unique_ptr<StatusHttp> follower_status_;
  std::unique_ptr<HttpServer> follower_http_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  std::unique_ptr<SchedulerDaemon> daemon_ ABSL_GUARDED_BY(mu_);
  EtcdStore* store_ ABSL_GUARDED_BY(mu_) = nullptr;  // Owned by daemon_.
  bool shut_down_ = false;
};

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_HA_SCHEDULER_H_
