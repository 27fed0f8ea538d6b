// A BackupTransport to PsHandlers in this process (no sockets): each call goes to the handler
// registered for its address as the gRPC Replicate call would (the chunk's values inside the
// request). Calls to an address can be made to fail, as an unreachable backup's do.
#ifndef PSCLUSTER_SERVER_TESTING_IN_PROCESS_BACKUP_TRANSPORT_H_
#define PSCLUSTER_SERVER_TESTING_IN_PROCESS_BACKUP_TRANSPORT_H_

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/backup_transport.h"
#include "server/ps_handler.h"

namespace pscluster::testing {

class InProcessBackupTransport final : public BackupTransport {
 public:
  // REQUIRES: `handler` outlives every call to `address`.
  void Add(const std::string& address, PsHandler* handler) {
    absl::MutexLock l(&mu_);
    handlers_[address] = handler;
  }
  // Every later call to `address` fails with `status` (OK: calls go through again).
  void Fail(const std::string& address, absl::Status status) {
    absl::MutexLock l(&mu_);
    failing_[address] = std::move(status);
  }
  // Calls delivered to `address`.
  int delivered(const std::string& address) const {
    absl::MutexLock l(&mu_);
    auto it = delivered_.find(address);
    return it == delivered_.end() ? 0 : it->second;
  }
  // Bytes of snapshots (ReplicateRequest.seed) and calls with a primary's clocks delivered to
  // `address`.
  uint64_t seed_bytes(const std::string& address) const {
    absl::MutexLock l(&mu_);
    auto it = seed_bytes_.find(address);
    return it == seed_bytes_.end() ? 0 : it->second;
  }
  int clocks_delivered(const std::string& address) const {
    absl::MutexLock l(&mu_);
    auto it = clocks_.find(address);
    return it == clocks_.end() ? 0 : it->second;
  }

  absl::Status Send(const std::string& address, const v1::ReplicateRequest& req,
                    const Payload& values) override {
    PsHandler* handler = nullptr;
    {
      absl::MutexLock l(&mu_);
      auto f = failing_.find(address);
      if (f != failing_.end() && !f->second.ok()) {
        return absl::Status(f->second.code(), absl::StrCat(address, ": ", f->second.message()));
      }
      auto h = handlers_.find(address);
      if (h == handlers_.end()) return absl::UnavailableError(absl::StrCat("no server at ", address));
      handler = h->second;
    }
    v1::ReplicateRequest with_values = req;
    if (!values.empty()) with_values.mutable_chunk()->set_values(values.ToString());
    v1::ReplicateResponse resp;
    absl::Status s = handler->Replicate(with_values, &resp);
    if (s.ok()) {
      absl::MutexLock l(&mu_);
      ++delivered_[address];
      seed_bytes_[address] += req.seed().size();
      if (req.has_clocks()) ++clocks_[address];
    }
    return s;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, PsHandler*> handlers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Status> failing_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> delivered_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> seed_bytes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> clocks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::testing

#endif  // PSCLUSTER_SERVER_TESTING_IN_PROCESS_BACKUP_TRANSPORT_H_
