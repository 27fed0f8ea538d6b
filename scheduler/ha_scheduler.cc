#include "scheduler/ha_scheduler.h"

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/channel.h"
#include "common/logging.h"
#include "common/status_convert.h"
#include "common/tls.h"
#include "common/parsed_unary.h"
#include "proto/scheduler.grpc.pb.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"

namespace pscluster::scheduler {

namespace {

// What a follower reads through: the leader's keys in etcd, never written.
class ReadOnlyStore final : public Store {
 public:
  explicit ReadOnlyStore(std::unique_ptr<Store> store) : store_(std::move(store)) {}
  absl::StatusOr<uint64_t> NextId(absl::string_view) override { return Refused(); }
  absl::StatusOr<std::string> ClusterKey() override { return Refused(); }
  absl::Status PutNode(const v1::NodeStatus&) override { return Refused(); }
  absl::StatusOr<std::vector<v1::NodeStatus>> LoadNodes() override { return store_->LoadNodes(); }
  absl::Status PutJob(const v1::Job&, absl::string_view, const v1::ShardMap*,
                      absl::string_view) override {
    return Refused();
  }
  absl::StatusOr<std::vector<StoredJob>> LoadJobs() override { return store_->LoadJobs(); }
  const std::string& path() const override { return store_->path(); }

 private:
  static absl::Status Refused() {
    return absl::FailedPreconditionError("a follower scheduler writes nothing");
  }
  std::unique_ptr<Store> store_;
};

}  // namespace

// A follower's view: jobs and shard maps as the leader last wrote them to etcd.
struct HaScheduler::View {
  RealClock clock;
  std::unique_ptr<Store> store;
  std::unique_ptr<Scheduler> scheduler;
  absl::Time taken;
};

// The Scheduler service of a follower: GetJob, ListJobs and GetShardMap from a view of etcd at
// most kViewMaxAge old; every other call UNAVAILABLE naming the leader.
class HaScheduler::FollowerService final
    : public ParsedUnaryService<v1::Scheduler::Service> {
 public:
  FollowerService(HaScheduler* owner, const Authorizer* authz)
      : ParsedUnaryService("pscluster.v1.Scheduler"), owner_(owner) {
    SetAuthorizer(authz);
    Refuse<v1::RegisterNodeRequest, v1::RegisterNodeResponse>("RegisterNode");
    Refuse<v1::HeartbeatRequest, v1::HeartbeatResponse>("Heartbeat");
    Refuse<v1::DeregisterRequest, v1::DeregisterResponse>("Deregister");
    Refuse<v1::SubmitJobRequest, v1::SubmitJobResponse>("SubmitJob");
    Read("GetJob", &Scheduler::GetJob);
    Read("ListJobs", &Scheduler::ListJobs);
    Refuse<v1::CancelJobRequest, v1::CancelJobResponse>("CancelJob");
    Read("GetShardMap", &Scheduler::GetShardMap);
    Refuse<v1::ReportProgressRequest, v1::ReportProgressResponse>("ReportProgress");
    // Nodes' liveness lives in the leader's memory (heartbeats), not in etcd: asked of it.
    Serve<v1::ClusterStatusRequest, v1::ClusterStatusResponse>(
        "ClusterStatus", [this](grpc::CallbackServerContext* ctx,
                                const v1::ClusterStatusRequest& req,
                                v1::ClusterStatusResponse* resp, Done done) {
          ForwardClusterStatus(ctx, req, resp, std::move(done));
        });
    Refuse<v1::MoveShardRequest, v1::MoveShardResponse>("MoveShard");
    Refuse<v1::CheckpointJobRequest, v1::CheckpointJobResponse>("CheckpointJob");
    Refuse<v1::ExportJobRequest, v1::ExportJobResponse>("ExportJob");
    Refuse<v1::TaskLogsRequest, v1::TaskLogsResponse>("GetTaskLogs");
    Refuse<v1::ScaleJobRequest, v1::ScaleJobResponse>("ScaleJob");
    Refuse<v1::DrainServerRequest, v1::DrainServerResponse>("DrainServer");
    Refuse<v1::UndrainServerRequest, v1::UndrainServerResponse>("UndrainServer");
    CheckEveryUnaryMethodServed();
  }

 private:
  // ClusterStatus, answered by the leader: the caller was authorized here (as viewer); its
  // bearer token goes along, so that the leader checks the same credential (the schedulers
  // share one token file), else the follower's own --credential_file token. Asynchronous: no
  // gRPC thread waits for the leader.
  void ForwardClusterStatus(grpc::CallbackServerContext* ctx, const v1::ClusterStatusRequest& req,
                            v1::ClusterStatusResponse* resp, Done done) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = owner_->LeaderChannel();
    if (!channel.ok()) {
      done(channel.status());
      return;
    }
    struct Call {
      std::shared_ptr<grpc::Channel> channel;
      std::unique_ptr<v1::Scheduler::Stub> stub;
      grpc::ClientContext ctx;
    };
    auto call = std::make_shared<Call>();
    call->channel = *channel;
    call->stub = v1::Scheduler::NewStub(call->channel);
    call->ctx.set_deadline(std::chrono::system_clock::now() +
                           absl::ToChronoMilliseconds(owner_->daemon_options_.rpc_timeout));
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    const std::string authorization = owner_->LeaderAuthorization(
        it == md.end() ? "" : std::string(it->second.data(), it->second.size()));
    if (!authorization.empty()) call->ctx.AddMetadata("authorization", authorization);
    const std::string leader = owner_->election_->leader();
    call->stub->async()->ClusterStatus(
        &call->ctx, &req, resp, [call, done = std::move(done), leader](grpc::Status s) {
          if (s.ok()) {
            done(absl::OkStatus());
            return;
          }
          absl::Status st = FromGrpcStatus(s);
          done(absl::Status(st.code(), absl::StrCat("ClusterStatus forwarded to the leader at ",
                                                    leader, ": ", st.message())));
        });
  }

  template <typename Req, typename Resp>
  void Refuse(absl::string_view method, absl::string_view why = "") {
    const std::string suffix(why);
    Serve<Req, Resp>(method, [this, suffix](grpc::CallbackServerContext*, const Req&, Resp*,
                                            Done done) {
      done(absl::UnavailableError(absl::StrCat(owner_->NotLeaderMessage(), suffix)));
    });
  }
  template <typename Req, typename Resp>
  void Read(absl::string_view method, absl::Status (Scheduler::*fn)(const Req&, Resp*)) {
    Serve<Req, Resp>(method, [this, fn](grpc::CallbackServerContext*, const Req& req, Resp* resp,
                                        Done done) {
      absl::StatusOr<std::shared_ptr<View>> view = owner_->CurrentView();
      if (!view.ok()) {
        done(absl::UnavailableError(absl::StrCat(owner_->NotLeaderMessage(),
                                                 "; reading etcd failed: ",
                                                 view.status().message())));
        return;
      }
      done(((*view)->scheduler.get()->*fn)(req, resp));
    });
  }

  HaScheduler* const owner_;
};

// A follower's status page (--http_listen): the leader's ClusterStatus, asked as
// ForwardClusterStatus does, and shard maps from the follower's view of etcd.
class HaScheduler::FollowerStatusSource final : public StatusSource {
 public:
  explicit FollowerStatusSource(HaScheduler* owner) : owner_(owner) {}

  absl::Status ClusterStatus(const v1::ClusterStatusRequest& req, v1::ClusterStatusResponse* resp,
                             const std::string& authorization) const override {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = owner_->LeaderChannel();
    if (!channel.ok()) return channel.status();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     absl::ToChronoMilliseconds(owner_->daemon_options_.rpc_timeout));
    const std::string leader_authorization = owner_->LeaderAuthorization(authorization);
    if (!leader_authorization.empty()) ctx.AddMetadata("authorization", leader_authorization);
    const std::string leader = owner_->election_->leader();
    grpc::Status s = v1::Scheduler::NewStub(*channel)->ClusterStatus(&ctx, req, resp);
    if (s.ok()) return absl::OkStatus();
    absl::Status st = FromGrpcStatus(s);
    return absl::Status(st.code(), absl::StrCat("ClusterStatus forwarded to the leader at ",
                                                leader, ": ", st.message()));
  }

  absl::Status GetShardMap(const v1::GetShardMapRequest& req, v1::ShardMap* resp,
                           const std::string&) const override {
    absl::StatusOr<std::shared_ptr<View>> view = owner_->CurrentView();
    if (!view.ok()) return view.status();
    return (*view)->scheduler->GetShardMap(req, resp);
  }

 private:
  HaScheduler* const owner_;
};

std::string HaScheduler::LeaderAuthorization(const std::string& caller) const {
  if (!caller.empty()) return caller;
  if (daemon_options_.credential.empty()) return "";
  return absl::StrCat("Bearer ", daemon_options_.credential);
}

std::string HaScheduler::NotLeaderMessage() const {
  if (!ready_.HasBeenNotified()) {
    return "this scheduler is starting; retry";
  }
  const std::string leader = election_->leader();
  return leader.empty() || leader == advertise_
             ? absl::StrCat("the scheduler at ", advertise_,
                            " does not lead and no leader is known yet (election in progress); "
                            "retry, or give every scheduler's address")
             : absl::StrCat("the scheduler at ", advertise_, " is a follower; the leader is at ",
                            leader);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> HaScheduler::LeaderChannel() {
  const std::string leader = ready_.HasBeenNotified() ? election_->leader() : "";
  if (leader.empty() || leader == advertise_) {
    return absl::UnavailableError(NotLeaderMessage());
  }
  absl::MutexLock l(&view_mu_);
  if (leader_channel_ == nullptr || leader_address_ != leader) {
    ChannelOptions o;
    o.tls = daemon_options_.tls;  // The schedulers' TLS files: a client of the leader too.
    auto channel = MakeChannel(leader, o);
    if (!channel.ok()) {
      return absl::UnavailableError(absl::StrCat(NotLeaderMessage(), "; ", channel.status().message()));
    }
    leader_channel_ = *channel;
    leader_address_ = leader;
  }
  return leader_channel_;
}

absl::StatusOr<std::shared_ptr<HaScheduler::View>> HaScheduler::CurrentView() {
  if (!ready_.HasBeenNotified()) return absl::UnavailableError("starting");
  absl::MutexLock l(&view_mu_);
  if (view_ != nullptr && absl::Now() - view_->taken < kViewMaxAge) return view_;
  auto view = std::make_shared<View>();
  view->store = std::make_unique<ReadOnlyStore>(std::make_unique<EtcdStore>(
      etcd_.get(), ha_.prefix, election_->options().key, /*term=*/0));
  auto scheduler =
      Scheduler::CreateView(daemon_options_.scheduler, view->store.get(), &view->clock);
  if (!scheduler.ok()) return scheduler.status();
  view->scheduler = std::move(*scheduler);
  view->taken = absl::Now();
  view_ = view;
  return view;
}

absl::StatusOr<std::unique_ptr<HaScheduler>> HaScheduler::Start(
    const SchedulerDaemonOptions& daemon, const HaOptions& ha) {
  if (ha.lease_seconds < 2 || ha.lease_seconds > 3600) {
    return absl::InvalidArgumentError("--etcd_lease_seconds: must be in [2, 3600]");
  }
  if (ha.prefix.empty() || ha.prefix.front() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd_prefix: '", ha.prefix, "' must start with '/'"));
  }
  std::unique_ptr<HaScheduler> h(new HaScheduler());
  h->daemon_options_ = daemon;
  h->ha_ = ha;
  auto etcd = EtcdClient::Connect(ha.etcd_endpoints, ha.etcd_timeout, ha.etcd_tls);
  if (!etcd.ok()) return etcd.status();
  h->etcd_ = std::move(*etcd);
  auto authz = Authorizer::Create(daemon.token_file);
  if (!authz.ok()) return authz.status();
  h->authz_ = std::move(*authz);
  absl::Status s = h->StartFollowerServer();
  if (!s.ok()) return s;
  h->advertise_ = ha.advertise_address.empty() ? h->address_ : ha.advertise_address;
  if (!daemon.port_file.empty()) {
    s = WriteFileAtomically(daemon.port_file, absl::StrCat(h->address_, "\n"));
    if (!s.ok()) {
      h->StopFollowerServer();
      return absl::Status(s.code(), absl::StrCat("--port_file: ", s.message()));
    }
  }
  std::string prefix = ha.prefix;
  if (prefix.back() != '/') prefix += '/';
  h->ha_.prefix = prefix;
  LeaderElectionOptions eo;
  eo.key = absl::StrCat(prefix, "leader");
  eo.value = h->advertise_;
  eo.ttl_seconds = ha.lease_seconds;
  h->election_ = std::make_unique<LeaderElection>(h->etcd_.get(), eo);
  h->follower_metrics_
      .AddGauge("pscluster_scheduler_leading",
                "1 while this scheduler leads (its daemon's /metrics), 0 while it follows.")
      ->Set(0);
  h->ready_.Notify();
  Logger("scheduler")->info(
      "scheduler {} at {} campaigning for the leadership of {} in etcd at {} (lease {} s)",
      daemon.scheduler.version, h->advertise_, prefix, ha.etcd_endpoints, ha.lease_seconds);
  HaScheduler* self = h.get();
  h->thread_ = std::thread([self] { self->Run(); });
  return h;
}

absl::Status HaScheduler::StartFollowerServer() {
  const std::string listen = address_.empty() ? daemon_options_.listen_address : address_;
  auto creds = MakeServerCredentials(daemon_options_.tls);
  if (!creds.ok()) return creds.status();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, *creds, &port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // A fresh service for each server: gRPC binds a generic service to one server for good.
  follower_service_ = std::make_unique<FollowerService>(this, authz_.get());
  builder.RegisterService(follower_service_.get());
  auto server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "--listen: cannot listen on ", listen, " (address in use, not local, or not permitted)"));
  }
  if (auto* health = server->GetHealthCheckService()) health->SetServingStatus(false);
  if (!daemon_options_.metrics_address.empty()) {
    auto metrics = MetricsHttpServer::Start(daemon_options_.metrics_address, &follower_metrics_);
    if (!metrics.ok()) {
      server->Shutdown();
      return metrics.status();
    }
    absl::MutexLock l(&mu_);
    follower_metrics_server_ = std::move(*metrics);
  }
  if (!daemon_options_.http_address.empty()) {
    // The same page as the leader's, its data asked of the leader.
    follower_status_ = std::make_unique<StatusHttp>(std::make_unique<FollowerStatusSource>(this),
                                                    authz_->enabled() ? authz_.get() : nullptr);
    HttpServerOptions http_options;
    http_options.address = daemon_options_.http_address;
    http_options.flag = "--http_listen";
    StatusHttp* page = follower_status_.get();
    auto http = HttpServer::Start(http_options,
                                  [page](const HttpRequest& req) { return page->Handle(req); });
    if (!http.ok()) {
      server->Shutdown();
      absl::MutexLock l(&mu_);
      follower_metrics_server_.reset();
      return http.status();
    }
    absl::MutexLock l(&mu_);
    follower_http_ = std::move(*http);
  }
  if (address_.empty()) {
    std::string host = listen.substr(0, listen.rfind(':'));
    if (host == "0.0.0.0" || host == "[::]" || host == "::" || host.empty()) host = "127.0.0.1";
    address_ = absl::StrCat(host, ":", port);
  }
  follower_server_ = std::move(server);
  Logger("scheduler")->info("listening on {} as a follower", address_);
  return absl::OkStatus();
}

int HaScheduler::metrics_port() const {
  absl::MutexLock l(&mu_);
  if (daemon_ != nullptr) return daemon_->metrics_port();
  return follower_metrics_server_ != nullptr ? follower_metrics_server_->port() : 0;
}

int HaScheduler::http_port() const {
  absl::MutexLock l(&mu_);
  if (daemon_ != nullptr) return daemon_->http_port();
  return follower_http_ != nullptr ? follower_http_->port() : 0;
}

void HaScheduler::StopFollowerServer() {
  {
    // The ports are the leader's daemon's next (same --metrics_listen, --http_listen).
    absl::MutexLock l(&mu_);
    follower_metrics_server_.reset();
    follower_http_.reset();
  }
  if (follower_server_ == nullptr) return;
  follower_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  follower_server_->Wait();
  follower_server_.reset();
  absl::MutexLock l(&view_mu_);
  view_.reset();
}

bool HaScheduler::leading() const {
  absl::MutexLock l(&mu_);
  return daemon_ != nullptr;
}

absl::Status HaScheduler::Reload() {
  absl::Status followed = authz_->Reload();
  absl::MutexLock l(&mu_);
  if (daemon_ == nullptr) return followed;
  absl::Status s = daemon_->ReloadTokenFile();
  if (!s.ok()) return s;
  return daemon_->ReloadQuotas();
}

void HaScheduler::Run() {
  while (!stop_.HasBeenNotified()) {
    absl::StatusOr<int64_t> term = election_->Campaign(&stop_);
    if (!term.ok()) break;
    // The store gets a client of its own, which stepping down closes (cancelling its calls).
    auto store_client = EtcdClient::Connect(ha_.etcd_endpoints, ha_.etcd_timeout, ha_.etcd_tls);
    if (!store_client.ok()) {  // The endpoints were accepted at start; not expected.
      Logger("scheduler")->error("elected but cannot connect the store: {}; resigning",
                                 store_client.status());
      election_->Resign();
      continue;
    }
    auto store = std::make_unique<EtcdStore>(std::move(*store_client), ha_.prefix,
                                             election_->options().key, *term);
    EtcdStore* raw = store.get();
    const absl::Time won = absl::Now();
    StopFollowerServer();
    SchedulerDaemonOptions o = daemon_options_;
    o.listen_address = address_;
    o.port_file.clear();
    o.db_path = raw->path();
    o.scheduler_term = *term;
    auto daemon = SchedulerDaemon::Start(o, nullptr, std::move(store));
    if (!daemon.ok()) {
      Logger("scheduler")->error("elected but cannot start the scheduler: {}; resigning",
                                 daemon.status());
      election_->Resign();
    } else {
      {
        absl::MutexLock l(&mu_);
        daemon_ = std::move(*daemon);
        store_ = raw;
      }
      Logger("scheduler")->info("leading (term {}): scheduler serving at {} {} after the election",
                                *term, address_, absl::FormatDuration(absl::Now() - won));
      const std::string why = election_->KeepLeading(&stop_);
      raw->Depose();
      std::unique_ptr<SchedulerDaemon> old;
      {
        absl::MutexLock l(&mu_);
        old = std::move(daemon_);
        store_ = nullptr;
      }
      if (why != "stopped") {
        Logger("scheduler")->warn("lost the leadership (term {}): {}; stopping the scheduler",
                                  *term, why);
      }
      // Quickly: the lease may expire soon after this and another scheduler take over.
      old->Shutdown(absl::Milliseconds(100));
      old.reset();
      if (why != "stopped") {
        const absl::Duration margin =
            election_->last_renewal() + absl::Seconds(ha_.lease_seconds) - absl::Now();
        Logger("scheduler")->info(
            "scheduler stopped (term {}), {} before the lease can expire at the earliest",
            *term, absl::FormatDuration(margin));
      }
    }
    if (stop_.HasBeenNotified()) {
      election_->Resign();
      break;
    }
    // Follow again on the same port (retrying while it is still being released), then give the
    // lease up (an etcd that cannot be reached keeps that call waiting).
    for (int i = 0; !stop_.HasBeenNotified(); ++i) {
      absl::Status s = StartFollowerServer();
      if (s.ok()) break;
      if (i % 20 == 0) Logger("scheduler")->warn("cannot listen as a follower yet: {}", s);
      stop_.WaitForNotificationWithTimeout(absl::Milliseconds(250));
    }
    election_->Resign();
    stop_.WaitForNotificationWithTimeout(absl::Seconds(1));
  }
}

HaScheduler::~HaScheduler() { Shutdown(); }

void HaScheduler::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
  StopFollowerServer();
}

}  // namespace pscluster::scheduler
