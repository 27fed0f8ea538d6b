#include "worker/entrypoint_runner.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "google/protobuf/util/json_util.h"
#include "worker/child_process.h"

extern char** environ;

namespace pscluster::worker {
namespace {

constexpr size_t kMaxLineBytes = 64 << 10;  // A longer stdout/stderr line is emitted in parts.
constexpr size_t kMaxProgressBytes = 64 << 10;

std::string Errno() { return strerror(errno); }

// A private directory for the task's file: mode 0700, a random name.
absl::StatusOr<std::string> MakeTaskDir(const std::string& root_opt, const std::string& job,
                                        uint32_t rank) {
  std::string root = root_opt;
  if (root.empty()) {
    const char* tmp = getenv("TMPDIR");  // The worker's own temp directory, as mkstemp's users do.
    root = tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp";
  }
  std::string templ = absl::StrCat(root, "/pscluster-", job, "-rank", rank, "-XXXXXX");
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the task's directory under ", root, ": ", Errno()));
  }
  return std::string(buf.data());
}

absl::Status WriteTaskFile(const std::string& path, const v1::AssignTaskRequest& task) {
  std::string bytes;
  if (!task.SerializeToString(&bytes)) return absl::InternalError("cannot serialize the task");
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return absl::FailedPreconditionError(absl::StrCat(path, ": ", Errno()));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string e = Errno();
      close(fd);
      return absl::FailedPreconditionError(absl::StrCat(path, ": ", e));
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
  return absl::OkStatus();
}

// The child's environment: the worker's (less its PSCLUSTER_ variables), the job's env, the
// contract's variables.
std::vector<std::string> ChildEnv(const v1::AssignTaskRequest& task,
                                  const EntrypointOptions& o, const std::string& task_file) {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    absl::string_view kv(*e);
    size_t eq = kv.find('=');
    if (eq == absl::string_view::npos || absl::StartsWith(kv, "PSCLUSTER_")) continue;
    env[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
  }
  for (const auto& [k, v] : task.spec().entrypoint().env()) env[k] = v;
  env["PSCLUSTER_TASK_FILE"] = task_file;
  env["PSCLUSTER_SCHEDULER"] = o.scheduler;
  env["PSCLUSTER_JOB_ID"] = task.job_id();
  env["PSCLUSTER_RANK"] = absl::StrCat(task.rank());
  env["PSCLUSTER_NUM_WORKERS"] = absl::StrCat(task.num_workers());
  env["PSCLUSTER_ATTEMPT"] = absl::StrCat(task.attempt());
  env["PSCLUSTER_PROGRESS_FD"] = "3";
  if (!o.tls_ca.empty()) env["PSCLUSTER_TLS_CA"] = o.tls_ca;
  if (!o.tls_cert.empty()) env["PSCLUSTER_TLS_CERT"] = o.tls_cert;
  if (!o.tls_key.empty()) env["PSCLUSTER_TLS_KEY"] = o.tls_key;
  if (!o.credential_file.empty()) env["PSCLUSTER_TOKEN_FILE"] = o.credential_file;
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(absl::StrCat(k, "=", v));
  return out;
}

}  // namespace

absl::StatusOr<v1::EntrypointProgress> ParseProgressLine(absl::string_view line) {
  if (line.size() > kMaxProgressBytes) {
    return absl::InvalidArgumentError(absl::StrCat("longer than ", kMaxProgressBytes, " bytes"));
  }
  v1::EntrypointProgress p;
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = true;  // Newer scripts may say more.
  auto s = google::protobuf::util::JsonStringToMessage(std::string(line), &p, opts);
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("not a JSON progress object: ",
                                                   std::string(s.message())));
  }
  if (!p.has_step()) return absl::InvalidArgumentError("step: required");
  if (p.step() < 0) return absl::InvalidArgumentError("step: must be >= 0");
  if (p.has_total_steps() && p.total_steps() < 0) {
    return absl::InvalidArgumentError("total_steps: must be >= 0");
  }
  if (p.has_loss() && !std::isfinite(p.loss())) {
    return absl::InvalidArgumentError("loss: must be a finite number");
  }
  for (const auto& [name, v] : p.metrics()) {
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat("metrics.", name, ": must be finite"));
    }
    if (name.empty() || name.size() > 64) {
      return absl::InvalidArgumentError("metrics: names must be 1-64 bytes");
    }
  }
  if (p.metrics_size() > 32) return absl::InvalidArgumentError("metrics: more than 32");
  return p;
}

absl::StatusOr<std::unique_ptr<EntrypointRunner>> EntrypointRunner::Create(
    const v1::AssignTaskRequest& task, EntrypointOptions options, ProgressSink* sink) {
  if (!options.allow) {
    return absl::FailedPreconditionError(
        "entrypoint: this worker does not run user commands; start ps_worker with "
        "--allow_entrypoints");
  }
  if (!task.spec().has_entrypoint() || task.spec().entrypoint().command_size() == 0) {
    return absl::InvalidArgumentError("spec.entrypoint.command: missing");
  }
  if (task.spec().cuda_graphs()) {
    // Refused rather than ignored: the option describes the built-in trainer's steps.
    return absl::InvalidArgumentError(
        "spec.cuda_graphs: describes the built-in trainer; a job with an entrypoint runs the "
        "user's command instead (leave it out)");
  }
  std::unique_ptr<EntrypointRunner> r(new EntrypointRunner(task, std::move(options), sink));
  if (pipe2(r->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("pipe: ", Errno()));
  }
  return r;
}

EntrypointRunner::EntrypointRunner(const v1::AssignTaskRequest& task, EntrypointOptions options,
                                   ProgressSink* sink)
    : task_(task), options_(std::move(options)), sink_(sink) {
  progress_.set_rank(task.rank());
  progress_.set_step(task.start_step());
  progress_.set_test_accuracy(-1);
  progress_.set_test_loss(-1);
  progress_.set_test_auc(-1);
  snapshot_.step = task.start_step();
  snapshot_.shard_map_epoch = task.shard_map().epoch();
}

EntrypointRunner::~EntrypointRunner() {
  for (int fd : wake_) {
    if (fd >= 0) close(fd);
  }
}

void EntrypointRunner::Cancel(absl::string_view reason) {
  {
    absl::MutexLock l(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
    cancel_reason_ = std::string(reason);
  }
  char b = 1;
  (void)!write(wake_[1], &b, 1);
}

void EntrypointRunner::UpdateShardMap(const v1::ShardMap& map) {
  // The script's library asks the scheduler for newer maps itself (GetShardMap on a stale-epoch
  // refusal); the worker only shows the epoch.
  absl::MutexLock l(&mu_);
  if (map.epoch() > snapshot_.shard_map_epoch) snapshot_.shard_map_epoch = map.epoch();
}

TaskSnapshot EntrypointRunner::Snapshot() const {
  absl::MutexLock l(&mu_);
  return snapshot_;
}

absl::Status EntrypointRunner::Run() {
  const std::string& job = task_.job_id();
  const uint32_t rank = task_.rank();
  if (options_.logs != nullptr) options_.logs->Begin(job, rank, task_.attempt());
  absl::Status s;
  auto dir = MakeTaskDir(options_.temp_root, job, rank);
  if (!dir.ok()) {
    s = dir.status();
  } else {
    const std::string file = *dir + "/task.pb";
    s = WriteTaskFile(file, task_);
    if (s.ok()) s = RunChild(file);
    std::error_code ec;
    std::filesystem::remove_all(*dir, ec);
    if (ec) Logger("worker")->warn("cannot remove {}: {}", *dir, ec.message());
  }
  if (options_.logs != nullptr && !child_ran_) {
    // Never started: say why where the user looks.
    options_.logs->Append(job, rank, task_.attempt(), "stderr",
                          absl::StrCat("ps_worker: the command did not start: ", s.ToString()));
    options_.logs->Finish(job, rank, task_.attempt(), -1);
  }
  return s;
}

void EntrypointRunner::OnLine(int stream, std::string line) {
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (stream == 2) {
    OnProgress(line);
    return;
  }
  const char* name = stream == 0 ? "stdout" : "stderr";
  Logger("worker")->info("{} rank {} {}| {}", task_.job_id(), task_.rank(), name, line);
  if (stream == 1) {
    last_stderr_ = last_stderr_.empty() ? line : absl::StrCat(last_stderr_, "\n", line);
    if (last_stderr_.size() > 2048) last_stderr_ = last_stderr_.substr(last_stderr_.size() - 2048);
  }
  if (options_.logs != nullptr) {
    options_.logs->Append(task_.job_id(), task_.rank(), task_.attempt(), name, std::move(line));
  }
}

void EntrypointRunner::OnProgress(const std::string& line) {
  auto p = ParseProgressLine(line);
  if (!p.ok()) {
    // Logged (the first few) and ignored: the script goes on.
    if (++bad_progress_lines_ <= 10) {
      Logger("worker")->warn("{} rank {}: progress line ignored ({}): {}", task_.job_id(),
                             task_.rank(), p.status().message(), line.substr(0, 200));
    }
    return;
  }
  const absl::Time now = absl::Now();
  progress_.set_step(p->step());
  if (p->has_epoch()) progress_.set_epoch(p->epoch());
  if (p->has_total_steps()) progress_.set_total_steps(p->total_steps());
  if (p->has_loss()) progress_.set_loss(p->loss());
  if (p->metrics_size() > 0) {
    *progress_.mutable_metrics() = p->metrics();
    auto acc = p->metrics().find("accuracy");
    if (acc != p->metrics().end()) progress_.set_train_accuracy(acc->second);
    auto test = p->metrics().find("test_accuracy");
    if (test != p->metrics().end()) progress_.set_test_accuracy(test->second);
  }
  if (p->has_examples()) {
    // Examples per second over windows of at least a second.
    if (rate_start_ == absl::InfinitePast() || p->examples() < rate_examples_) {
      rate_start_ = now;
      rate_examples_ = p->examples();
    } else if (now - rate_start_ >= absl::Seconds(1)) {
      progress_.set_samples_per_sec((p->examples() - rate_examples_) /
                                    absl::ToDoubleSeconds(now - rate_start_));
      rate_start_ = now;
      rate_examples_ = p->examples();
    }
  }
  {
    absl::MutexLock l(&mu_);
    snapshot_.step = progress_.step();
    snapshot_.samples_per_sec = progress_.samples_per_sec();
  }
  if (!sink_->Report(progress_)) Cancel("the scheduler stopped the job");
}

absl::Status EntrypointRunner::RunChild(const std::string& task_file) {
  auto log = Logger("worker");
  const std::string& job = task_.job_id();
  const uint32_t rank = task_.rank();
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) return absl::ResourceExhaustedError("pipe: " + Errno());
  ChildOptions co;
  co.argv.assign(task_.spec().entrypoint().command().begin(),
                 task_.spec().entrypoint().command().end());
  co.env = ChildEnv(task_, options_, task_file);
  co.working_dir = task_.spec().entrypoint().working_dir();
  co.fd3 = report[1];
  auto child = ChildProcess::Spawn(co);
  close(report[1]);
  if (!child.ok()) {
    close(report[0]);
    return child.status();
  }
  fcntl(report[0], F_SETFL, fcntl(report[0], F_GETFL) | O_NONBLOCK);
  ChildProcess& c = **child;
  child_ran_ = true;
  log->info("{} rank {} attempt {}: started [{}] as pid {}", job, rank, task_.attempt(),
            absl::StrJoin(co.argv, " "), c.pid());

  struct Stream {
    int fd;
    std::string buf;
    bool open = true;
  };
  Stream streams[3] = {{c.stdout_fd()}, {c.stderr_fd()}, {report[0]}};
  bool termed = false, killed = false, cancelled = false;
  std::string reason;
  absl::Time kill_at = absl::InfiniteFuture(), drain_until = absl::InfiniteFuture();
  std::optional<ChildExit> exit;
  char buf[16384];
  while (true) {
    pollfd fds[4];
    int n = 0;
    int which[4];
    for (int i = 0; i < 3; ++i) {
      if (!streams[i].open) continue;
      fds[n] = {streams[i].fd, POLLIN, 0};
      which[n++] = i;
    }
    fds[n] = {wake_[0], POLLIN, 0};
    which[n++] = -1;
    ::poll(fds, n, 100);
    for (int k = 0; k < n; ++k) {
      if (fds[k].revents == 0) continue;
      if (which[k] < 0) {
        while (read(wake_[0], buf, sizeof(buf)) > 0) {
        }
        continue;
      }
      Stream& st = streams[which[k]];
      while (true) {
        ssize_t got = read(st.fd, buf, sizeof(buf));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
          if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
            st.open = false;
            if (!st.buf.empty()) OnLine(which[k], std::move(st.buf));
            st.buf.clear();
          }
          break;
        }
        st.buf.append(buf, static_cast<size_t>(got));
        size_t start = 0, nl;
        while ((nl = st.buf.find('\n', start)) != std::string::npos) {
          OnLine(which[k], st.buf.substr(start, nl - start));
          start = nl + 1;
        }
        st.buf.erase(0, start);
        if (st.buf.size() > kMaxLineBytes) {  // A line without end: emit it in parts.
          OnLine(which[k], std::move(st.buf));
          st.buf.clear();
        }
      }
    }
    const absl::Time now = absl::Now();
    {
      absl::MutexLock l(&mu_);
      cancelled = cancelled_;
      reason = cancel_reason_;
    }
    if (cancelled && !termed && !exit.has_value()) {
      log->info("{} rank {}: stopping pid {} ({}): SIGTERM, SIGKILL after {}", job, rank,
                c.pid(), reason, absl::FormatDuration(options_.stop_grace));
      c.Signal(SIGTERM);
      termed = true;
      kill_at = now + options_.stop_grace;
    }
    if (termed && !killed && now >= kill_at && !exit.has_value()) {
      log->warn("{} rank {}: pid {} still runs after SIGTERM: SIGKILL", job, rank, c.pid());
      c.Signal(SIGKILL);
      killed = true;
    }
    if (!exit.has_value()) {
      exit = c.Poll();
      if (exit.has_value()) {
        c.Signal(SIGKILL);  // What is left of its process group: no orphans.
        drain_until = now + absl::Seconds(2);
      }
    }
    const bool all_closed = !streams[0].open && !streams[1].open && !streams[2].open;
    if (exit.has_value() && (all_closed || now >= drain_until)) break;
  }
  close(report[0]);

  const int code = exit->signaled ? -1 : exit->code;
  if (options_.logs != nullptr) options_.logs->Finish(job, rank, task_.attempt(), code);
  log->info("{} rank {} attempt {}: pid {} ended: {}", job, rank, task_.attempt(), c.pid(),
            exit->ToString());
  if (cancelled) return absl::CancelledError(reason);
  if (!exit->signaled && exit->code == 0) return absl::OkStatus();
  const std::string tail =
      last_stderr_.empty() ? std::string() : absl::StrCat("; last stderr: ", last_stderr_);
  if (!exit->signaled && exit->code == kEntrypointRetryExit) {
    return absl::UnavailableError(absl::StrCat(
        "entrypoint exited with status 75 (EX_TEMPFAIL: retryable)", tail));
  }
  if (exit->signaled) {
    // Not sent by this worker (a cancelled task returned above): the rank is handed over, as
    // for a lost worker.
    return absl::UnavailableError(
        absl::StrCat("entrypoint was killed by ", exit->ToString(), tail));
  }
  return absl::UnknownError(absl::StrCat("entrypoint [", absl::StrJoin(co.argv, " "),
                                         "] exited with ", exit->ToString(), tail));
}

}  // namespace pscluster::worker
