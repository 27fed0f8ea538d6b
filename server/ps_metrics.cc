#include "server/ps_metrics.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace pscluster {
namespace {

std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

std::string JobLabel(const v1::JobOnServer& j) { return absl::StrCat("job=\"", Escape(j.job_id()), "\""); }

// One Status per scrape: the families of a scrape share a snapshot taken at most 200 ms ago.
class Snapshots {
 public:
  explicit Snapshots(PsHandler* h) : handler_(h) {}
  v1::ServerStatus Get() {
    absl::MutexLock l(&mu_);
    if (absl::Now() - taken_ > absl::Milliseconds(200)) {
      last_.Clear();
      (void)handler_->Status(v1::ServerStatusRequest(), &last_);
      taken_ = absl::Now();
    }
    return last_;
  }

 private:
  PsHandler* const handler_;
  absl::Mutex mu_;
  v1::ServerStatus last_ ABSL_GUARDED_BY(mu_);
  absl::Time taken_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace

void RegisterServerMetrics(PsHandler* handler, MetricsRegistry* r) {
  auto snap = std::make_shared<Snapshots>(handler);
  auto one = [snap](double (*get)(const v1::ServerStatus&)) {
    return [snap, get]() { return std::vector<Sample>{{"", get(snap->Get())}}; };
  };
  r->AddGaugeCallback("pscluster_server_uptime_seconds", "Seconds since the daemon started.",
                      one([](const v1::ServerStatus& s) { return s.uptime_sec(); }));
  r->AddCounterCallback("pscluster_server_push_chunks_total", "Push chunks applied.",
                        one([](const v1::ServerStatus& s) { return double(s.pushes_total()); }));
  r->AddCounterCallback("pscluster_server_pulls_total", "Pull requests served.",
                        one([](const v1::ServerStatus& s) { return double(s.pulls_total()); }));
  r->AddCounterCallback("pscluster_server_duplicate_pushes_total",
                        "Push chunks acknowledged without being applied again.",
                        one([](const v1::ServerStatus& s) { return double(s.duplicates_total()); }));
  r->AddCounterCallback("pscluster_server_bytes_in_total", "Payload bytes received.",
                        one([](const v1::ServerStatus& s) { return double(s.bytes_in_total()); }));
  r->AddCounterCallback("pscluster_server_bytes_out_total", "Payload bytes sent.",
                        one([](const v1::ServerStatus& s) { return double(s.bytes_out_total()); }));
  r->AddCounterCallback(
      "pscluster_server_copies_on_write_total",
      "Dense blocks copied before an update because a reply in flight still held their weights.",
      one([](const v1::ServerStatus& s) { return double(s.times().copies_on_write()); }));
  r->AddGaugeCallback("pscluster_server_queue_depth", "Requests accepted and not finished.",
                      one([](const v1::ServerStatus& s) { return double(s.queue_depth()); }));
  MemoryBudget* budget = handler->budget();
  r->AddGaugeCallback("pscluster_server_memory_used_bytes", "Parameter and optimizer bytes held.",
                      [budget] { return std::vector<Sample>{{"", double(budget->used())}}; });
  r->AddGaugeCallback("pscluster_server_memory_limit_bytes", "--memory_bytes (default: this machine's memory).",
                      [budget] { return std::vector<Sample>{{"", double(budget->limit())}}; });
  // Each phase's durations one by one, as a histogram (the totals above are their sums).
  const char* const kPhaseNames[PsHandler::kNumPhases] = {"parse", "queue", "apply", "read",
                                                          "park"};
  for (int p = 0; p < PsHandler::kNumPhases; ++p) {
    handler->SetPhaseHistogram(
        static_cast<PsHandler::Phase>(p),
        r->AddHistogram("pscluster_server_phase_seconds",
                        "Data-plane latency by phase: parse (a request's decoding), queue (a push "
                        "waiting for its table), apply (a push chunk applied), read (a pull's "
                        "values copied out), park (a pull waiting for slower workers).",
                        absl::StrCat("phase=\"", kPhaseNames[p], "\"")));
  }
  r->AddCounterCallback("pscluster_server_phase_seconds_total",
                        "Data-plane time by phase, summed over threads.", [snap] {
                          const v1::ServerStatus st = snap->Get();
                          const auto& t = st.times();
                          return std::vector<Sample>{{"phase=\"parse\"", t.parse_sec()},
                                                     {"phase=\"queue\"", t.queue_sec()},
                                                     {"phase=\"apply\"", t.apply_sec()},
                                                     {"phase=\"read\"", t.read_sec()},
                                                     {"phase=\"park\"", t.park_sec()}};
                        });
  auto per_job = [snap](double (*get)(const v1::JobOnServer&)) {
    return [snap, get] {
      std::vector<Sample> out;
      const v1::ServerStatus st = snap->Get();
      for (const auto& j : st.jobs()) out.push_back({JobLabel(j), get(j)});
      return out;
    };
  };
  r->AddGaugeCallback("pscluster_job_min_clock", "Slowest worker's clock.",
                      per_job([](const v1::JobOnServer& j) { return double(j.min_clock()); }));
  r->AddGaugeCallback("pscluster_job_waiting_pulls", "Pulls parked for BSP/SSP.",
                      per_job([](const v1::JobOnServer& j) { return double(j.waiting_pulls()); }));
  r->AddGaugeCallback("pscluster_job_mean_staleness", "Mean reader clock minus min clock.",
                      per_job([](const v1::JobOnServer& j) { return j.mean_staleness(); }));
  r->AddGaugeCallback("pscluster_job_checkpoint_age_seconds",
                      "Seconds since the last checkpoint (-1 = none).",
                      per_job([](const v1::JobOnServer& j) { return j.checkpoint_age_sec(); }));
  r->AddGaugeCallback("pscluster_job_worker_clock", "Steps each worker completed on this server.",
                      [snap] {
                        std::vector<Sample> out;
                        const v1::ServerStatus st = snap->Get();
                        for (const auto& j : st.jobs()) {
                          for (const auto& c : j.clocks()) {
                            out.push_back({absl::StrCat(JobLabel(j), ",worker=\"", c.worker(), "\""),
                                           double(c.clock())});
                          }
                        }
                        return out;
                      });
  r->AddGaugeCallback("pscluster_table_bytes", "Parameter and optimizer bytes of a table held here.",
                      [snap] {
                        std::vector<Sample> out;
                        const v1::ServerStatus st = snap->Get();
                        for (const auto& j : st.jobs()) {
                          for (const auto& t : j.tables()) {
                            out.push_back({absl::StrCat(JobLabel(j), ",table=\"", Escape(t.name()), "\""),
                                           double(t.bytes())});
                          }
                        }
                        return out;
                      });
  // Sparse (embedding) tables: rows held and what admission and expiry did (EmbeddingSpec).
  auto per_sparse_table = [snap](uint64_t (v1::TableStatus::*field)() const) {
    return [snap, field] {
      std::vector<Sample> out;
      const v1::ServerStatus st = snap->Get();
      for (const auto& j : st.jobs()) {
        for (const auto& t : j.tables()) {
          if (t.kind() != v1::SPARSE) continue;
          out.push_back({absl::StrCat(JobLabel(j), ",table=\"", Escape(t.name()), "\""),
                         double((t.*field)())});
        }
      }
      return out;
    };
  };
  r->AddGaugeCallback("pscluster_table_rows",
                      "Rows of a sparse table held here (in memory and in its disk tier).",
                      per_sparse_table(&v1::TableStatus::rows));
  r->AddCounterCallback("pscluster_table_admissions_total",
                        "Rows of a sparse table made by a push (past its admission filter).",
                        per_sparse_table(&v1::TableStatus::admissions));
  r->AddCounterCallback("pscluster_table_pushes_not_admitted_total",
                        "Row pushes counted but not applied: the key was not admitted yet.",
                        per_sparse_table(&v1::TableStatus::pushes_not_admitted));
  r->AddCounterCallback("pscluster_table_expiries_total",
                        "Rows of a sparse table restarted or freed because they had expired.",
                        per_sparse_table(&v1::TableStatus::expiries));
  r->AddGaugeCallback("pscluster_table_rows_on_disk",
                      "Rows of a sparse table in its disk tier here (--spill_dir).",
                      per_sparse_table(&v1::TableStatus::rows_on_disk));
  r->AddCounterCallback("pscluster_table_ram_hits_total",
                        "Row touches (pushes and pulls) that found the row in memory.",
                        per_sparse_table(&v1::TableStatus::ram_hits));
  r->AddCounterCallback("pscluster_table_disk_reads_total",
                        "Row touches that found the row on disk (a push brings it back when it "
                        "was pushed more often lately than the rows spilled lately).",
                        per_sparse_table(&v1::TableStatus::disk_reads));
  r->AddCounterCallback("pscluster_table_spills_total",
                        "Rows moved from memory to the disk tier (evictions).",
                        per_sparse_table(&v1::TableStatus::spills));
  r->AddCounterCallback("pscluster_table_updated_on_disk_total",
                        "Row pushes applied where the row lay on disk (it was not hot enough to "
                        "come back into memory).",
                        per_sparse_table(&v1::TableStatus::updated_on_disk));
  r->AddGaugeCallback("pscluster_table_ram_hit_ratio",
                      "Share of row touches served from memory (tables with a disk tier).",
                      [snap] {
                        std::vector<Sample> out;
                        const v1::ServerStatus st = snap->Get();
                        for (const auto& j : st.jobs()) {
                          for (const auto& t : j.tables()) {
                            const uint64_t n = t.ram_hits() + t.disk_reads();
                            if (t.kind() != v1::SPARSE || n == 0) continue;
                            out.push_back({absl::StrCat(JobLabel(j), ",table=\"",
                                                        Escape(t.name()), "\""),
                                           double(t.ram_hits()) / double(n)});
                          }
                        }
                        return out;
                      });
  r->AddCounterCallback("pscluster_table_reads_without_row_total",
                        "Rows pulled that had none here (the initializer's values were sent).",
                        per_sparse_table(&v1::TableStatus::reads_without_row));
}

}  // namespace pscluster
