#include "scheduler/etcd_store.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/data_auth.h"
#include "scheduler/etcd_store.pb.h"

namespace pscluster::scheduler {
namespace {

constexpr int kMaxConflicts = 20;

etcdserverpb::RequestOp PutOp(const std::string& key, const std::string& value) {
  etcdserverpb::RequestOp op;
  op.mutable_request_put()->set_key(key);
  op.mutable_request_put()->set_value(value);
  return op;
}

// The sequence number of "job-N" (0 for other ids).
uint64_t JobSeq(const std::string& id) {
  uint64_t n = 0;
  const size_t dash = id.find('-');
  if (dash == std::string::npos || !absl::SimpleAtoi(id.substr(dash + 1), &n)) return 0;
  return n;
}

}  // namespace

EtcdStore::EtcdStore(EtcdClient* etcd, std::string prefix, std::string election_key, int64_t term)
    : etcd_(etcd),
      prefix_(std::move(prefix)),
      election_key_(std::move(election_key)),
      term_(term),
      path_(absl::StrCat("etcd://", etcd->endpoints(), prefix_)) {}

EtcdStore::EtcdStore(std::unique_ptr<EtcdClient> etcd, std::string prefix,
                     std::string election_key, int64_t term)
    : EtcdStore(etcd.get(), std::move(prefix), std::move(election_key), term) {
  own_ = std::move(etcd);
}

void EtcdStore::Depose() {
  deposed_.store(true);
  if (own_ != nullptr) own_->Close();
}

absl::Status EtcdStore::NotLeader(absl::string_view what) const {
  return absl::FailedPreconditionError(
      absl::StrCat("scheduler state in ", path_, ": cannot ", what,
                   ": this scheduler no longer leads (term ", term_, ")"));
}

absl::Status EtcdStore::FencedTxn(const std::vector<std::pair<std::string, int64_t>>& expect,
                                  std::vector<etcdserverpb::RequestOp> ops,
                                  absl::string_view what, int64_t* revision) {
  if (deposed_.load()) return NotLeader(what);
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* lead = txn.add_compare();
  lead->set_key(election_key_);
  lead->set_target(etcdserverpb::Compare::CREATE);
  lead->set_result(etcdserverpb::Compare::EQUAL);
  lead->set_create_revision(term_);
  for (const auto& [key, rev] : expect) {
    etcdserverpb::Compare* c = txn.add_compare();
    c->set_key(key);
    c->set_target(etcdserverpb::Compare::MOD);
    c->set_result(etcdserverpb::Compare::EQUAL);
    c->set_mod_revision(rev);
  }
  for (etcdserverpb::RequestOp& op : ops) *txn.add_success() = std::move(op);
  txn.add_failure()->mutable_request_range()->set_key(election_key_);
  auto resp = etcd_->Txn(txn);
  if (!resp.ok()) {
    return absl::Status(resp.status().code(),
                        absl::StrCat("cannot ", what, ": ", resp.status().message()));
  }
  if (resp->succeeded()) {
    if (revision != nullptr) *revision = resp->header().revision();
    return absl::OkStatus();
  }
  const etcdserverpb::RangeResponse& r = resp->responses(0).response_range();
  if (r.kvs_size() == 0 || r.kvs(0).create_revision() != term_) {
    deposed_.store(true);
    return NotLeader(what);
  }
  return absl::AbortedError(absl::StrCat("cannot ", what, ": changed meanwhile"));
}

absl::StatusOr<uint64_t> EtcdStore::NextId(absl::string_view counter) {
  absl::MutexLock l(&write_mu_);
  const std::string key = absl::StrCat(prefix_, "counters/", counter);
  for (int i = 0; i < kMaxConflicts; ++i) {
    if (deposed_.load()) return NotLeader(absl::StrCat("advance counter ", counter));
    uint64_t value = 0;
    int64_t rev = 0;
    auto kv = etcd_->Get(key);
    if (kv.ok()) {
      if (!absl::SimpleAtoi(kv->value(), &value)) {
        return absl::DataLossError(absl::StrCat("scheduler state in ", path_, ": counter ", key,
                                                " holds '", kv->value(), "', not a number"));
      }
      rev = kv->mod_revision();
    } else if (!absl::IsNotFound(kv.status())) {
      return kv.status();
    }
    absl::Status s = FencedTxn({{key, rev}}, {PutOp(key, absl::StrCat(value + 1))},
                               absl::StrCat("advance counter ", counter));
    if (s.ok()) return value + 1;
    if (!absl::IsAborted(s)) return s;
  }
  return absl::UnavailableError(absl::StrCat("scheduler state in ", path_, ": counter ", counter,
                                             " keeps changing under this scheduler"));
}

absl::StatusOr<uint64_t> EtcdStore::NextEpoch(absl::string_view job_id, uint64_t current) {
  int64_t revision = 0;
  absl::Status s = FencedTxn({}, {PutOp(absl::StrCat(prefix_, "epochs/", job_id), "")},
                             absl::StrCat("take a shard-map epoch for job ", job_id), &revision);
  if (!s.ok()) return s;
  return std::max<uint64_t>(current + 1, static_cast<uint64_t>(revision));
}

absl::StatusOr<std::string> EtcdStore::ClusterKey() {
  const std::string key = absl::StrCat(prefix_, "cluster_key");
  for (int i = 0; i < kMaxConflicts; ++i) {
    if (deposed_.load()) return NotLeader("read the cluster key");
    auto kv = etcd_->Get(key);
    if (kv.ok()) {
      if (kv->value().size() != kDataSecretBytes) {
        return absl::DataLossError(absl::StrCat("the cluster key in ", path_, " has ",
                                                kv->value().size(), " bytes (",
                                                kDataSecretBytes, " expected)"));
      }
      return kv->value();
    }
    if (!absl::IsNotFound(kv.status())) return kv.status();
    absl::StatusOr<std::string> fresh = RandomBytes(kDataSecretBytes);
    if (!fresh.ok()) return fresh.status();
    absl::MutexLock l(&write_mu_);
    absl::Status s = FencedTxn({{key, 0}}, {PutOp(key, *fresh)}, "store the cluster key");
    if (!s.ok() && !absl::IsAborted(s)) return s;
  }
  return absl::UnavailableError(absl::StrCat("scheduler state in ", path_,
                                             ": the cluster key cannot be read back"));
}

absl::Status EtcdStore::PutNode(const v1::NodeStatus& node) {
  absl::MutexLock l(&write_mu_);
  return FencedTxn({}, {PutOp(absl::StrCat(prefix_, "nodes/", node.info().node_id()),
                              node.SerializeAsString())},
                   absl::StrCat("write node ", node.info().node_id()));
}

absl::StatusOr<std::vector<v1::NodeStatus>> EtcdStore::LoadNodes() {
  if (deposed_.load()) return NotLeader("read nodes");
  auto resp = etcd_->GetPrefix(absl::StrCat(prefix_, "nodes/"));
  if (!resp.ok()) return resp.status();
  std::vector<v1::NodeStatus> out;
  for (const etcdserverpb::KeyValue& kv : resp->kvs()) {
    v1::NodeStatus n;
    if (!n.ParseFromString(kv.value())) {
      return absl::DataLossError(absl::StrCat("scheduler state in ", path_, ": the record ",
                                              kv.key(), " cannot be parsed"));
    }
    out.push_back(std::move(n));
  }
  return out;
}

absl::Status EtcdStore::PutJob(const v1::Job& job, absl::string_view client_token,
                               const v1::ShardMap* map, absl::string_view owner) {
  absl::MutexLock l(&write_mu_);
  const std::string key = absl::StrCat(prefix_, "jobs/", job.job_id());
  const std::string what = absl::StrCat("write job ", job.job_id());
  for (int i = 0; i < kMaxConflicts; ++i) {
    if (deposed_.load()) return NotLeader(what);
    v1::StoredJobRecord rec;
    int64_t rev = 0;
    auto kv = etcd_->Get(key);
    if (kv.ok()) {
      if (!rec.ParseFromString(kv->value())) {
        return absl::DataLossError(absl::StrCat("scheduler state in ", path_, ": the record of job ",
                                                job.job_id(), " cannot be parsed"));
      }
      rev = kv->mod_revision();
    } else if (!absl::IsNotFound(kv.status())) {
      return kv.status();
    } else {
      rec.set_owner(std::string(owner));
    }
    *rec.mutable_job() = job;
    rec.set_client_token(std::string(client_token));
    // As the SQLite store: the map with the highest epoch written is the job's map.
    if (map != nullptr && (!rec.has_shard_map() || map->epoch() >= rec.shard_map().epoch())) {
      *rec.mutable_shard_map() = *map;
    }
    absl::Status s = FencedTxn({{key, rev}}, {PutOp(key, rec.SerializeAsString())}, what);
    if (!absl::IsAborted(s)) return s;
  }
  return absl::UnavailableError(absl::StrCat("scheduler state in ", path_, ": job ",
                                             job.job_id(), " keeps changing under this scheduler"));
}

absl::StatusOr<std::vector<StoredJob>> EtcdStore::LoadJobs() {
  if (deposed_.load()) return NotLeader("read jobs");
  auto resp = etcd_->GetPrefix(absl::StrCat(prefix_, "jobs/"), etcdserverpb::RangeRequest::CREATE);
  if (!resp.ok()) return resp.status();
  std::vector<StoredJob> out;
  for (const etcdserverpb::KeyValue& kv : resp->kvs()) {
    v1::StoredJobRecord rec;
    if (!rec.ParseFromString(kv.value()) || !rec.has_job()) {
      return absl::DataLossError(absl::StrCat("scheduler state in ", path_, ": the record ",
                                              kv.key(), " cannot be parsed"));
    }
    StoredJob j;
    j.job = std::move(*rec.mutable_job());
    j.client_token = rec.client_token();
    j.owner = rec.owner();
    if (rec.has_shard_map()) j.shard_map = std::move(*rec.mutable_shard_map());
    out.push_back(std::move(j));
  }
  // Submission order, as the SQLite store: by time, then by the id's sequence number; etcd's
  // creation order (the range's sort) breaks the remaining ties.
  std::stable_sort(out.begin(), out.end(), [](const StoredJob& a, const StoredJob& b) {
    return std::make_tuple(a.job.submitted_unix_ms(), JobSeq(a.job.job_id())) <
           std::make_tuple(b.job.submitted_unix_ms(), JobSeq(b.job.job_id()));
  });
  return out;
}

}  // namespace pscluster::scheduler
