#include "scheduler/psctl/format.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "google/protobuf/util/json_util.h"
#include "scheduler/job_state.h"
#include "yaml-cpp/yaml.h"

namespace pscluster::psctl {
namespace {

std::string Metric(double v, int digits = 4) {
  if (v < 0) return "-";
  if (std::isnan(v)) return "nan";
  return absl::StrFormat("%.*f", digits, v);
}

// The latest test AUC (two-class models): the evaluating rank's, picked as the scheduler picks
// its test accuracy (the lowest rank still in the job that has evaluated); -1 = none.
double TestAuc(const v1::JobProgress& p) {
  for (const v1::WorkerProgress& w : p.workers()) {
    if (w.left()) continue;
    if (w.test_accuracy() >= 0) return w.test_auc();
  }
  return -1;
}

std::string Ago(int64_t then_ms, int64_t now_ms) {
  if (then_ms <= 0) return "-";
  return HumanDuration(std::max<int64_t>(0, now_ms - then_ms) / 1000.0) + " ago";
}

std::string When(int64_t ms) {
  if (ms <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(ms), absl::LocalTimeZone());
}

double Fraction(const v1::JobProgress& p) {
  if (p.total_steps() <= 0) return 0;
  return std::clamp(static_cast<double>(p.step()) / p.total_steps(), 0.0, 1.0);
}

std::string NodeState(v1::NodeState s) {
  switch (s) {
    case v1::NODE_ALIVE:
      return "alive";
    case v1::NODE_SUSPECT:
      return "suspect";
    case v1::NODE_DEAD:
      return "dead";
    case v1::NODE_LEFT:
      return "left";
    default:
      return "unknown";
  }
}

std::string Role(v1::NodeRole r) {
  switch (r) {
    case v1::ROLE_SERVER:
      return "server";
    case v1::ROLE_WORKER:
      return "worker";
    default:
      return "other";
  }
}

void EmitYaml(YAML::Emitter& out, const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map:
      out << YAML::BeginMap;
      for (auto it = n.begin(); it != n.end(); ++it) {
        out << YAML::Key << it->first.Scalar() << YAML::Value;
        EmitYaml(out, it->second);
      }
      out << YAML::EndMap;
      break;
    case YAML::NodeType::Sequence:
      out << YAML::BeginSeq;
      for (const auto& e : n) EmitYaml(out, e);
      out << YAML::EndSeq;
      break;
    case YAML::NodeType::Scalar:
      out << n.Scalar();
      break;
    default:
      out << YAML::Null;
  }
}

}  // namespace

absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text) {
  if (text == "table" || text.empty()) return OutputFormat::kTable;
  if (text == "json") return OutputFormat::kJson;
  if (text == "yaml") return OutputFormat::kYaml;
  return absl::InvalidArgumentError(
      absl::StrCat("-o: '", text, "' is not an output format (table, json or yaml)"));
}

std::string ToJson(const google::protobuf::Message& msg) {
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(msg, &out, o);
  return out;
}

std::string ToYaml(const google::protobuf::Message& msg) {
  // JSON is YAML: parse the JSON form and write it in block style.
  YAML::Node node = YAML::Load(ToJson(msg));
  YAML::Emitter out;
  EmitYaml(out, node);
  return std::string(out.c_str()) + "\n";
}

std::string Table::ToString() const {
  std::vector<size_t> width;
  for (const auto& row : rows_) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows_) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

std::string ProgressBar(double fraction, int width) {
  fraction = std::clamp(fraction, 0.0, 1.0);
  int filled = static_cast<int>(std::round(fraction * width));
  return absl::StrFormat("[%s%s] %3d%%", std::string(filled, '#'), std::string(width - filled, '.'),
                         static_cast<int>(std::floor(fraction * 100)));
}

std::string HumanDuration(double s) {
  if (s < 0 || std::isnan(s)) return "-";
  if (s < 10) return absl::StrFormat("%.1fs", s);
  int64_t t = static_cast<int64_t>(std::llround(s));
  if (t < 60) return absl::StrCat(t, "s");
  if (t < 3600) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  if (t < 86400) return absl::StrFormat("%dh%02dm", t / 3600, (t % 3600) / 60);
  return absl::StrFormat("%dd%02dh", t / 86400, (t % 86400) / 3600);
}

std::string HumanBytes(double b) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f %s", b, units[u]) : absl::StrFormat("%.1f %s", b, units[u]);
}

std::string JobsTable(const v1::ListJobsResponse& jobs, int64_t now_ms) {
  if (jobs.jobs_size() == 0) return "No jobs.\n";
  Table t({"JOB", "NAME", "STATE", "PROGRESS", "EPOCH", "LOSS", "TEST ACC", "TEST AUC",
           "SUBMITTED", "REASON"});
  for (const v1::Job& j : jobs.jobs()) {
    const v1::JobProgress& p = j.progress();
    std::string progress = p.total_steps() > 0
                               ? absl::StrFormat("%d/%d (%d%%)", p.step(), p.total_steps(),
                                                 static_cast<int>(Fraction(p) * 100))
                               : "-";
    std::string reason = j.reason();
    if (reason.size() > 60) reason = reason.substr(0, 57) + "...";
    t.Add({j.job_id(), j.spec().name(), scheduler::JobStateName(j.state()), progress,
           absl::StrCat(p.epoch(), "/", j.spec().epochs()),
           p.total_steps() > 0 ? Metric(p.loss()) : "-", Metric(p.test_accuracy()),
           Metric(TestAuc(p)), Ago(j.submitted_unix_ms(), now_ms), reason});
  }
  return t.ToString();
}

std::string JobLine(const v1::Job& j) {
  const v1::JobProgress& p = j.progress();
  std::string line = absl::StrCat(j.job_id(), " ", scheduler::JobStateName(j.state()));
  if (!j.reason().empty() && j.state() != v1::JOB_RUNNING) absl::StrAppend(&line, ": ", j.reason());
  if (p.total_steps() == 0) return line;  // Nothing reported yet.
  absl::StrAppend(&line, " ", ProgressBar(Fraction(p), 24), " step ", p.step(), "/",
                  p.total_steps(), " epoch ", p.epoch(), "/", j.spec().epochs());
  if (p.total_steps() > 0) absl::StrAppend(&line, " loss ", Metric(p.loss()));
  if (p.train_accuracy() > 0) absl::StrAppend(&line, " train acc ", Metric(p.train_accuracy()));
  if (p.test_accuracy() >= 0) absl::StrAppend(&line, " test acc ", Metric(p.test_accuracy()));
  if (TestAuc(p) >= 0) absl::StrAppend(&line, " test AUC ", Metric(TestAuc(p)));
  if (p.samples_per_sec() > 0) {
    absl::StrAppend(&line, " ", absl::StrFormat("%.0f", p.samples_per_sec()), " samples/s");
  }
  if (j.state() == v1::JOB_RUNNING && p.eta_sec() >= 0) {
    absl::StrAppend(&line, " ETA ", HumanDuration(p.eta_sec()));
  }
  if (p.waiting_for_size() > 0) {
    absl::StrAppend(&line, " waiting for rank ", absl::StrJoin(p.waiting_for(), ","));
  }
  if (j.recovery().recoveries() > 0 && j.state() == v1::JOB_RUNNING) {
    absl::StrAppend(&line, " (rolled back ", j.recovery().recoveries(), "x, resumed at step ",
                    j.recovery().start_step(), ")");
  }
  return line;
}

std::string JobDetail(const v1::Job& j, const std::vector<v1::NodeStatus>& nodes,
                      int64_t now_ms) {
  std::map<std::string, std::string> address;
  for (const v1::NodeStatus& n : nodes) address[n.info().node_id()] = n.info().address();
  auto named = [&](const std::string& id) {
    auto it = address.find(id);
    return it == address.end() ? id : absl::StrCat(id, " (", it->second, ")");
  };
  const v1::JobProgress& p = j.progress();
  Table kv({"Job:", absl::StrCat(j.job_id(), " (", j.spec().name(), ")")});
  kv.Add({"State:", scheduler::JobStateName(j.state())});
  if (!j.reason().empty()) kv.Add({"Reason:", j.reason()});
  kv.Add({"Progress:", absl::StrCat(ProgressBar(Fraction(p)), "  step ", p.step(), "/",
                                    p.total_steps(), "  epoch ", p.epoch(), "/",
                                    j.spec().epochs())});
  kv.Add({"Loss:", absl::StrCat(p.total_steps() > 0 ? Metric(p.loss()) : "-", "   train acc ",
                                p.total_steps() > 0 ? Metric(p.train_accuracy()) : "-")});
  kv.Add({"Test:", absl::StrCat("accuracy ", Metric(p.test_accuracy()), "   loss ",
                                Metric(p.test_loss()), "   AUC ", Metric(TestAuc(p)))});
  kv.Add({"Throughput:", absl::StrCat(absl::StrFormat("%.0f", p.samples_per_sec()),
                                      " samples/s   ETA ", HumanDuration(p.eta_sec()))});
  if (p.waiting_for_size() > 0) {
    std::vector<std::string> w;
    for (uint32_t r : p.waiting_for()) {
      std::string node = static_cast<int>(r) < j.workers_size() ? named(j.workers(r)) : "?";
      w.push_back(absl::StrCat("rank ", r, " on ", node));
    }
    kv.Add({"Waiting for:", absl::StrJoin(w, ", ")});
  }
  if (p.rolled_back_to_step() >= 0) {
    kv.Add({"Rolled back:", absl::StrCat("to step ", p.rolled_back_to_step())});
  }
  if (j.recovery().recoveries() + j.recovery().handovers() + j.recovery().promotions() +
          j.recovery().rejoins() > 0) {
    const v1::JobRecovery& r = j.recovery();
    kv.Add({"Recoveries:",
            absl::StrCat(r.recoveries(), " rollback(s), ", r.handovers(), " hand-over(s), ",
                         r.promotions() > 0 ? absl::StrCat(r.promotions(), " promotion(s), ") : "",
                         r.rejoins() > 0 ? absl::StrCat(r.rejoins(), " rejoin(s), ") : "",
                         "the last ", Ago(r.recovered_unix_ms(), now_ms), " from: ",
                         r.last_cause())});
    if (r.recoveries() > 0) {
      kv.Add({"Restored:", r.restore_from_size() == 0
                               ? absl::StrCat("nothing (restarted from step ", r.start_step(), ")")
                               : absl::StrCat(r.restore_from_size(),
                                              " checkpoint file(s) of step ", r.start_step())});
    }
  }
  if (!j.recovery().left().empty()) {
    std::vector<std::string> left;
    for (const v1::LeftRank& l : j.recovery().left()) {
      left.push_back(absl::StrCat(
          "rank ", l.rank(),
          l.step() >= 0 ? absl::StrCat(" at step ", l.step()) : std::string(" (leaving)"),
          " (", named(l.node_id()), " lost ",
          Ago(l.unix_ms(), now_ms), "), its data to ",
          l.adopted_by() == l.rank() ? std::string("nobody") : absl::StrCat("rank ", l.adopted_by())));
    }
    kv.Add({"Left the job:", absl::StrCat(absl::StrJoin(left, "; "), "; ",
                                          j.workers_size() - j.recovery().left_size(), " of ",
                                          j.workers_size(), " ranks train on")});
  }
  if (j.spec().balance_data()) {
    const v1::JobRecovery& r = j.recovery();
    std::string shares = "equal parts";
    if (r.data_shares_size() > 0) {
      double total = 0;
      for (uint32_t s : r.data_shares()) total += s;
      std::vector<std::string> parts;
      for (int q = 0; q < r.data_shares_size(); ++q) {
        parts.push_back(absl::StrFormat("rank %d %.0f%%", q, 100.0 * r.data_shares(q) / total));
      }
      shares = absl::StrJoin(parts, ", ");
    }
    kv.Add({"Data balance:",
            absl::StrCat(shares, r.rebalances() > 0
                                     ? absl::StrCat(" (changed ", r.rebalances(), "x, the last ",
                                                    Ago(r.balanced_unix_ms(), now_ms), ")")
                                     : std::string(" (by compute rate, not changed yet)"))});
  }
  if (!j.moves().empty()) {
    const v1::ShardMove& m = *j.moves().rbegin();
    std::string state;
    switch (m.state()) {
      case v1::MOVE_QUEUED: state = "queued"; break;
      case v1::MOVE_COPYING: state = "copying"; break;
      case v1::MOVE_DONE: state = absl::StrCat("done ", Ago(m.finished_unix_ms(), now_ms), ", ", m.result()); break;
      case v1::MOVE_FAILED: state = absl::StrCat("given up ", Ago(m.finished_unix_ms(), now_ms), ": ", m.result()); break;
      default: state = "?"; break;
    }
    kv.Add({"Shard moves:", absl::StrCat(j.shard_moves(), " done; last: shard ", m.shard(),
                                         m.backup() ? " (a backup)" : "", " ",
                                         named(m.from()), " -> ", named(m.to()), " ", state,
                                         " (", m.reason(), ")")});
  }
  if (j.has_elastic()) {
    const v1::ElasticChange& e = j.elastic();
    std::vector<std::string> to;
    for (const std::string& s : e.servers()) to.push_back(named(s));
    kv.Add({"Servers change:",
            absl::StrCat(e.reason(), " -> ", absl::StrJoin(to, ", "), ": ",
                         e.active() ? absl::StrCat("under way, ", e.moves_done(), " shard(s) moved")
                                    : absl::StrCat(e.result(), " ",
                                                   Ago(e.finished_unix_ms(), now_ms)))});
  }
  std::vector<std::string> servers;
  for (const std::string& s : j.servers()) servers.push_back(named(s));
  kv.Add({"Servers:", servers.empty() ? "-" : absl::StrJoin(servers, ", ")});
  kv.Add({"Shard map:", j.shard_map_epoch() > 0
                            ? absl::StrCat("epoch ", j.shard_map_epoch(), ", ",
                                           j.spec().num_virtual_shards(), " virtual shards")
                            : "-"});
  kv.Add({"Consistency:", absl::StrCat(
                              v1::ConsistencySpec::Mode_Name(j.spec().consistency().mode()),
                              j.spec().consistency().mode() == v1::ConsistencySpec::SSP
                                  ? absl::StrCat(" (staleness ", j.spec().consistency().staleness(),
                                                 ")")
                                  : "")});
  if (!j.export_path().empty()) kv.Add({"Exported:", j.export_path()});
  kv.Add({"Submitted:", absl::StrCat(When(j.submitted_unix_ms()), " (",
                                     Ago(j.submitted_unix_ms(), now_ms), ")")});
  if (j.started_unix_ms() > 0) kv.Add({"Started:", When(j.started_unix_ms())});
  if (j.finished_unix_ms() > 0) {
    kv.Add({"Finished:", absl::StrCat(When(j.finished_unix_ms()), " (took ",
                                      HumanDuration((j.finished_unix_ms() -
                                                     std::max(j.started_unix_ms(),
                                                              j.submitted_unix_ms())) /
                                                    1000.0),
                                      ")")});
  }
  std::string out = kv.ToString();
  if (p.workers_size() > 0) {
    Table w({"RANK", "NODE", "STEP", "EPOCH", "BATCH", "LOSS", "TRAIN ACC", "TEST ACC",
             "SAMPLES/S", "PULL WAIT", "COMPUTE", "PUSH", "STATE"});
    for (const v1::WorkerProgress& wp : p.workers()) {
      double busy = wp.pull_wait_sec() + wp.compute_sec() + wp.push_sec();
      auto share = [&](double v) {
        return busy > 0 ? absl::StrFormat("%.0f%%", 100 * v / busy) : std::string("-");
      };
      std::string state = wp.left()             ? "left the job"
                          : !wp.error().empty() ? "error"
                          : wp.done()           ? "done"
                          : wp.updated_unix_ms() > 0
                              ? absl::StrCat("reported ", Ago(wp.updated_unix_ms(), now_ms))
                              : "starting";
      bool reported = wp.updated_unix_ms() > 0;
      w.Add({absl::StrCat(wp.rank()), named(wp.node_id()), absl::StrCat(wp.step()),
             absl::StrCat(wp.epoch()),
             wp.batch_size() > 0 ? absl::StrCat(wp.batch_size()) : std::string("-"),
             reported ? Metric(wp.loss()) : "-",
             reported ? Metric(wp.train_accuracy()) : "-", Metric(wp.test_accuracy()),
             absl::StrFormat("%.0f", wp.samples_per_sec()), share(wp.pull_wait_sec()),
             share(wp.compute_sec()), share(wp.push_sec()), state});
    }
    out += "\n" + w.ToString();
  }
  return out;
}

std::string NodesTable(const v1::ClusterStatusResponse& st) {
  if (st.nodes_size() == 0) return "No nodes have registered.\n";
  Table t({"NODE", "ROLE", "ADDRESS", "STATE", "HEARTBEAT", "CAPACITY", "TRAFFIC", "MEMORY USED",
           "JOBS"});
  for (const v1::NodeStatus& n : st.nodes()) {
    const v1::Resources& c = n.info().capacity();
    std::string cap;
    if (n.info().role() == v1::ROLE_WORKER) {
      cap = c.gpus() > 0 ? absl::StrCat(c.gpus(), " GPU") : absl::StrCat(c.cpu_slots(), " CPU slot");
    } else {
      cap = c.memory_bytes() > 0 ? HumanBytes(c.memory_bytes()) : "-";
    }
    std::string state = NodeState(n.state());
    if (n.drain() == v1::NODE_DRAINING) absl::StrAppend(&state, ", draining");
    if (n.drain() == v1::NODE_DRAINED) absl::StrAppend(&state, ", drained");
    t.Add({n.info().node_id(), Role(n.info().role()), n.info().address(), state,
           Ago(n.last_heartbeat_unix_ms(), st.now_unix_ms()), cap,
           absl::StrCat(HumanBytes(n.load().bytes_per_sec()), "/s"),
           HumanBytes(n.load().memory_used_bytes()),
           n.jobs_size() > 0 ? absl::StrJoin(n.jobs(), ",") : "-"});
  }
  return t.ToString();
}

std::string ShardsTable(const v1::ShardMap& map, const std::vector<v1::ShardLoad>& loads) {
  std::map<std::string, std::string> address;
  for (const v1::ServerEndpoint& ep : map.servers()) address[ep.node_id()] = ep.address();
  std::map<uint32_t, const v1::Load*> load;
  for (const v1::ShardLoad& l : loads) {
    if (l.job_id() == map.job_id()) load[l.shard()] = &l.load();
  }
  std::map<std::string, int> per_server;
  for (const v1::ShardAssignment& a : map.assignments()) ++per_server[a.primary()];
  std::string out = absl::StrCat("Job ", map.job_id(), ": shard map epoch ", map.epoch(), ", ",
                                 map.num_virtual_shards(), " virtual shards on ",
                                 map.servers_size(), " servers\n\n");
  Table s({"SERVER", "ADDRESS", "PRIMARY SHARDS"});
  for (const auto& [id, n] : per_server) s.Add({id, address[id], absl::StrCat(n)});
  out += s.ToString() + "\n";
  Table t({"SHARD", "PRIMARY", "BACKUPS", "TRAFFIC", "REQUESTS/S"});
  for (const v1::ShardAssignment& a : map.assignments()) {
    auto it = load.find(a.shard());
    t.Add({absl::StrCat(a.shard()), a.primary(),
           a.backups_size() > 0 ? absl::StrJoin(a.backups(), ",") : "-",
           it == load.end() ? "-" : absl::StrCat(HumanBytes(it->second->bytes_per_sec()), "/s"),
           it == load.end() ? "-" : absl::StrFormat("%.1f", it->second->requests_per_sec())});
  }
  return out + t.ToString();
}

namespace {

std::string EventKind(v1::JobEventKind k) {
  switch (k) {
    case v1::JOB_EVENT_STATE:
      return "state";
    case v1::JOB_EVENT_ROLLBACK:
      return "rollback";
    case v1::JOB_EVENT_HANDOVER:
      return "hand-over";
    case v1::JOB_EVENT_PROMOTION:
      return "promotion";
    case v1::JOB_EVENT_RANK_LEFT:
      return "rank left";
    case v1::JOB_EVENT_RANK_REJOINED:
      return "rejoin";
    case v1::JOB_EVENT_SHARD_MOVE:
      return "shard move";
    case v1::JOB_EVENT_DATA_BALANCE:
      return "data balance";
    default:
      return "other";
  }
}

}  // namespace

std::string HistoryText(const v1::Job& j, int max_rows) {
  const v1::JobHistory& h = j.history();
  std::string out = absl::StrCat("Job ", j.job_id(), ": ", h.points_size(), " progress points");
  if (h.step_spacing() > 1) absl::StrAppend(&out, " (one every ", h.step_spacing(), " steps)");
  absl::StrAppend(&out, ", ", h.events_size(), " events");
  if (h.events_dropped() > 0) absl::StrAppend(&out, " (", h.events_dropped(), " older dropped)");
  out += "\n\n";
  if (h.events_size() > 0) {
    Table e({"TIME", "STEP", "EVENT", "WHAT"});
    for (const v1::JobEvent& ev : h.events()) {
      e.Add({When(ev.unix_ms()), absl::StrCat(ev.step()), EventKind(ev.kind()), ev.text()});
    }
    out += e.ToString() + "\n";
  }
  if (h.points_size() == 0) return out + "No progress reported yet.\n";
  Table t({"TIME", "STEP", "LOSS", "TRAIN ACC", "TEST ACC", "TEST LOSS", "TEST AUC", "SAMPLES/S"});
  const int n = h.points_size();
  const int rows = std::max(2, std::min(n, max_rows));
  int last = -1;
  for (int r = 0; r < rows; ++r) {
    const int i = n <= 1 ? 0 : static_cast<int>(static_cast<int64_t>(r) * (n - 1) / (rows - 1));
    if (i == last) continue;
    last = i;
    const v1::ProgressPoint& p = h.points(i);
    t.Add({When(p.unix_ms()), absl::StrCat(p.step()), Metric(p.loss()),
           Metric(p.train_accuracy()), Metric(p.test_accuracy()), Metric(p.test_loss()),
           Metric(p.test_auc()), absl::StrFormat("%.0f", p.samples_per_sec())});
  }
  out += t.ToString();
  if (n > rows) out += absl::StrCat("(", rows, " of ", n, " points shown; -o json has them all)\n");
  return out;
}

}  // namespace pscluster::psctl
