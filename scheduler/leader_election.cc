#include "scheduler/leader_election.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pscluster::scheduler {

LeaderElection::LeaderElection(EtcdClient* etcd, LeaderElectionOptions options)
    : etcd_(etcd), options_(std::move(options)) {}

LeaderElection::~LeaderElection() = default;

std::string LeaderElection::leader() const {
  absl::MutexLock l(&mu_);
  return leader_;
}

int64_t LeaderElection::term() const {
  absl::MutexLock l(&mu_);
  return term_;
}

absl::Time LeaderElection::last_renewal() const {
  absl::MutexLock l(&mu_);
  return last_renewal_;
}

void LeaderElection::SetLeader(const std::string& leader) {
  absl::MutexLock l(&mu_);
  if (leader != leader_) {
    Logger("election")->info("leader: {}", leader.empty() ? "none" : leader);
  }
  leader_ = leader;
}

absl::StatusOr<int64_t> LeaderElection::Campaign(absl::Notification* stop) {
  bool outage_logged = false;
  int64_t lease = 0;
  while (!stop->HasBeenNotified()) {
    auto fail = [&](const absl::Status& s) {
      if (!outage_logged) {
        Logger("election")->warn("cannot campaign for {}: {} (retrying)", options_.key, s);
        outage_logged = true;
      }
      stop->WaitForNotificationWithTimeout(options_.poll);
    };
    if (lease == 0) {
      auto granted = etcd_->LeaseGrant(options_.ttl_seconds);
      if (!granted.ok()) {
        fail(granted.status());
        continue;
      }
      lease = *granted;
    }
    const absl::Time sent = absl::Now();
    etcdserverpb::TxnRequest txn;
    etcdserverpb::Compare* absent = txn.add_compare();
    absent->set_key(options_.key);
    absent->set_target(etcdserverpb::Compare::CREATE);
    absent->set_result(etcdserverpb::Compare::EQUAL);
    absent->set_create_revision(0);
    etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(options_.key);
    put->set_value(options_.value);
    put->set_lease(lease);
    txn.add_failure()->mutable_request_range()->set_key(options_.key);
    auto resp = etcd_->Txn(txn);
    if (!resp.ok()) {
      fail(resp.status());
      continue;
    }
    if (outage_logged) Logger("election")->info("etcd reachable again");
    outage_logged = false;
    if (resp->succeeded()) {
      absl::MutexLock l(&mu_);
      term_ = resp->header().revision();
      lease_ = lease;
      last_renewal_ = sent;  // The lease was granted (or last kept) before this.
      leader_ = options_.value;
      Logger("election")->info("{} leads (term {}, lease {} s)", options_.value, term_,
                               options_.ttl_seconds);
      return term_;
    }
    std::string holder;
    const etcdserverpb::RangeResponse& r = resp->responses(0).response_range();
    if (r.kvs_size() > 0) holder = r.kvs(0).value();
    SetLeader(holder);
    // Our lease stays granted for the next try; keep it alive meanwhile.
    auto left = etcd_->LeaseKeepAlive(lease, etcd_->timeout());
    if (!left.ok() || *left <= 0) lease = 0;
    stop->WaitForNotificationWithTimeout(options_.poll);
  }
  if (lease != 0) (void)etcd_->LeaseRevoke(lease);
  return absl::CancelledError("stopped while campaigning");
}

std::string LeaderElection::KeepLeading(absl::Notification* stop) {
  const absl::Duration ttl = absl::Seconds(options_.ttl_seconds);
  const absl::Duration every = std::max(ttl / 6, absl::Milliseconds(100));
  const absl::Duration give_up = ttl * 2 / 3;
  int64_t lease;
  absl::Time last;
  {
    absl::MutexLock l(&mu_);
    lease = lease_;
    last = last_renewal_;
  }
  absl::Time next = absl::Now() + every;
  absl::Status error = absl::OkStatus();
  while (true) {
    // Renew at `next`, but never wait past the moment this leader must give up.
    const absl::Time deadline = last + give_up;
    if (stop->WaitForNotificationWithTimeout(std::min(next, deadline) - absl::Now())) {
      return "stopped";
    }
    const absl::Time sent = absl::Now();
    if (sent >= deadline) {
      return absl::StrCat("no lease renewal confirmed for ", absl::FormatDuration(sent - last),
                          error.ok() ? "" : absl::StrCat(" (", error.message(), ")"));
    }
    // The call may not outlast that moment either, and leaves time for another try (an etcd
    // member that went away mid-call, a raft election).
    auto left = etcd_->LeaseKeepAlive(
        lease, std::min({deadline - sent, etcd_->timeout(), 2 * every}));
    if (left.ok() && *left > 0) {
      last = sent;
      next = sent + every;
      absl::MutexLock l(&mu_);
      last_renewal_ = sent;
      continue;
    }
    if (left.ok()) return absl::StrCat("lease ", lease, " expired");
    error = left.status();
    next = absl::Now() + std::min(every, absl::Milliseconds(100));  // Retry soon.
  }
}

void LeaderElection::Resign() {
  int64_t lease;
  {
    absl::MutexLock l(&mu_);
    lease = lease_;
    lease_ = 0;
    term_ = 0;
    if (leader_ == options_.value) leader_.clear();
  }
  if (lease != 0) (void)etcd_->LeaseRevoke(lease);
}

}  // namespace pscluster::scheduler
