#include "common/scheduler_term.h"

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pscluster {

void AddSchedulerTerm(grpc::ClientContext* ctx, int64_t term) {
  if (term > 0) ctx->AddMetadata(kSchedulerTermHeader, absl::StrCat(term));
}

absl::Status SchedulerTermFence::Admit(const grpc::ServerContextBase& ctx,
                                       absl::string_view method) {
  const auto& md = ctx.client_metadata();
  auto it = md.find(kSchedulerTermHeader);
  if (it == md.end()) return absl::OkStatus();
  const absl::string_view text(it->second.data(), it->second.size());
  int64_t term = 0;
  if (!absl::SimpleAtoi(text, &term) || term <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kSchedulerTermHeader, ": '", absl::CEscape(text), "' is not a positive decimal number"));
  }
  return AdmitTerm(term, method);
}

absl::Status SchedulerTermFence::AdmitTerm(int64_t term, absl::string_view method) {
  if (term <= 0) return absl::OkStatus();
  int64_t seen = highest_.load(std::memory_order_acquire);
  while (term > seen) {
    if (highest_.compare_exchange_weak(seen, term, std::memory_order_acq_rel)) {
      if (seen > 0) {
        Logger("fence")->info("a new scheduler leads: term {} (was {})", term, seen);
      }
      return absl::OkStatus();
    }
  }
  if (term == seen) return absl::OkStatus();
  refused_.fetch_add(1, std::memory_order_relaxed);
  Logger("fence")->warn("{} refused: it comes from a deposed scheduler (term {}; term {} leads)",
                        method, term, seen);
  return absl::FailedPreconditionError(absl::StrCat(
      method, ": refused: this call comes from a deposed scheduler (term ", term,
      "); the scheduler of term ", seen, " leads the cluster now"));
}

}  // namespace pscluster
