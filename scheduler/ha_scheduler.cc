#include "scheduler/ha_scheduler.h"

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/logging.h"
#include "common/tls.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"

namespace pscluster::scheduler {

// Every call a follower gets (the health service aside): UNAVAILABLE naming the leader.
class HaScheduler::NotLeaderService final : public grpc::CallbackGenericService {
 public:
  explicit NotLeaderService(HaScheduler* owner) : owner_(owner) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    const std::string leader = owner_->leader();
    std::string msg =
        leader.empty() || leader == owner_->advertise_
            ? absl::StrCat("the scheduler at ", owner_->advertise_,
                           " does not lead and no leader is known yet (election in progress); "
                           "retry, or give every scheduler's address")
            : absl::StrCat("the scheduler at ", owner_->advertise_,
                           " is a follower; the leader is at ", leader);
    Logger("scheduler")->debug("{}: refused: {}", ctx->method(), msg);
    class Refuse final : public grpc::ServerGenericBidiReactor {
     public:
      explicit Refuse(const std::string& msg) {
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, msg));
      }
      void OnDone() override { delete this; }
    };
    return new Refuse(msg);
  }

 private:
  HaScheduler* const owner_;
};

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
  auto etcd = EtcdClient::Connect(ha.etcd_endpoints, ha.etcd_timeout);
  if (!etcd.ok()) return etcd.status();
  h->etcd_ = std::move(*etcd);
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
  not_leader_ = std::make_unique<NotLeaderService>(this);
  builder.RegisterCallbackGenericService(not_leader_.get());
  auto server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "--listen: cannot listen on ", listen, " (address in use, not local, or not permitted)"));
  }
  if (auto* health = server->GetHealthCheckService()) health->SetServingStatus(false);
  if (address_.empty()) {
    std::string host = listen.substr(0, listen.rfind(':'));
    if (host == "0.0.0.0" || host == "[::]" || host == "::" || host.empty()) host = "127.0.0.1";
    address_ = absl::StrCat(host, ":", port);
  }
  follower_server_ = std::move(server);
  Logger("scheduler")->info("listening on {} as a follower", address_);
  return absl::OkStatus();
}

void HaScheduler::StopFollowerServer() {
  if (follower_server_ == nullptr) return;
  follower_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  follower_server_->Wait();
  follower_server_.reset();
}

bool HaScheduler::leading() const {
  absl::MutexLock l(&mu_);
  return daemon_ != nullptr;
}

absl::Status HaScheduler::Reload() {
  absl::MutexLock l(&mu_);
  if (daemon_ == nullptr) return absl::OkStatus();
  absl::Status s = daemon_->ReloadTokenFile();
  if (!s.ok()) return s;
  return daemon_->ReloadQuotas();
}

void HaScheduler::Run() {
  while (!stop_.HasBeenNotified()) {
    absl::StatusOr<int64_t> term = election_->Campaign(&stop_);
    if (!term.ok()) break;
    // The store gets a client of its own, which stepping down closes (cancelling its calls).
    auto store_client = EtcdClient::Connect(ha_.etcd_endpoints, ha_.etcd_timeout);
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
