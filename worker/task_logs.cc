#include "worker/task_logs.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace pscluster::worker {

void TaskLogBook::Begin(const std::string& job, uint32_t rank, uint32_t attempt) {
  absl::MutexLock l(&mu_);
  Task& t = tasks_[{job, rank}];
  t = Task();
  t.attempt = attempt;
  t.begun = ++begun_;
  while (tasks_.size() > limits_.max_tasks) {
    // The oldest finished task, else the oldest.
    auto victim = tasks_.end();
    for (auto it = tasks_.begin(); it != tasks_.end(); ++it) {
      if (it->second.begun == begun_) continue;
      if (victim == tasks_.end() || (it->second.finished && !victim->second.finished) ||
          (it->second.finished == victim->second.finished &&
           it->second.begun < victim->second.begun)) {
        victim = it;
      }
    }
    if (victim == tasks_.end()) break;
    tasks_.erase(victim);
  }
}

void TaskLogBook::Append(const std::string& job, uint32_t rank, uint32_t attempt,
                         const char* stream, std::string text) {
  if (text.size() > limits_.max_line_bytes) {
    text.resize(limits_.max_line_bytes);
    text += " [cut]";
  }
  absl::MutexLock l(&mu_);
  auto it = tasks_.find({job, rank});
  if (it == tasks_.end() || it->second.attempt != attempt) return;
  Task& t = it->second;
  v1::TaskLogLine line;
  line.set_seq(next_seq_++);
  line.set_stream(stream);
  line.set_unix_ms(absl::ToUnixMillis(absl::Now()));
  t.bytes += text.size();
  line.set_text(std::move(text));
  t.lines.push_back(std::move(line));
  while (!t.lines.empty() &&
         (t.lines.size() > limits_.max_lines || t.bytes > limits_.max_bytes)) {
    t.bytes -= t.lines.front().text().size();
    t.lines.pop_front();
  }
}

void TaskLogBook::Finish(const std::string& job, uint32_t rank, uint32_t attempt,
                         int exit_code) {
  absl::MutexLock l(&mu_);
  auto it = tasks_.find({job, rank});
  if (it == tasks_.end() || it->second.attempt != attempt) return;
  it->second.finished = true;
  it->second.exit_code = exit_code;
}

absl::StatusOr<v1::TaskLogsResponse> TaskLogBook::Read(const v1::TaskLogsRequest& req) const {
  if (req.max_lines() > 10000) {
    return absl::InvalidArgumentError("max_lines: must be at most 10000 (0 = 1000)");
  }
  const size_t max = req.max_lines() == 0 ? 1000 : req.max_lines();
  absl::MutexLock l(&mu_);
  auto it = tasks_.find({req.job_id(), req.rank()});
  if (it == tasks_.end()) {
    return absl::NotFoundError(absl::StrCat("no output of job ", req.job_id(), " rank ",
                                            req.rank(), " is kept on this worker"));
  }
  const Task& t = it->second;
  v1::TaskLogsResponse resp;
  resp.set_attempt(t.attempt);
  resp.set_first_seq(t.lines.empty() ? 0 : t.lines.front().seq());
  uint64_t next = req.after_seq();
  // Lines are in sequence order: skip those the reader has.
  auto first = std::upper_bound(
      t.lines.begin(), t.lines.end(), req.after_seq(),
      [](uint64_t seq, const v1::TaskLogLine& line) { return seq < line.seq(); });
  for (auto l_it = first; l_it != t.lines.end() && static_cast<size_t>(resp.lines_size()) < max;
       ++l_it) {
    *resp.add_lines() = *l_it;
    next = l_it->seq();
  }
  resp.set_next_seq(next);
  // Finished only once the reader has every line.
  resp.set_finished(t.finished && (t.lines.empty() || next >= t.lines.back().seq()));
  resp.set_exit_code(t.exit_code);
  return resp;
}

}  // namespace pscluster::worker
