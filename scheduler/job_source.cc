#include "scheduler/job_source.h"

#include "absl/strings/str_cat.h"

namespace pscluster::scheduler {

JobSource::JobSource(std::string name) : name_(name.empty() ? "job spec" : std::move(name)) {}

void JobSource::SetLine(absl::string_view path, int line) {
  if (line > 0) lines_[std::string(path)] = line;
}

int JobSource::LineOf(absl::string_view path) const {
  std::string p(path);
  while (true) {
    auto it = lines_.find(p);
    if (it != lines_.end()) return it->second;
    if (p.empty()) return 0;
    p = ParentPath(p);
  }
}

absl::Status JobSource::Error(absl::string_view path, absl::string_view message) const {
  return ErrorAtLine(LineOf(path), path, message);
}

absl::Status JobSource::ErrorAtLine(int line, absl::string_view path,
                                    absl::string_view message) const {
  std::string where = line > 0 ? absl::StrCat(name_, ":", line) : name_;
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", message));
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", path, ": ", message));
}

std::string ParentPath(absl::string_view path) {
  if (!path.empty() && path.back() == ']') {
    size_t open = path.rfind('[');
    if (open != absl::string_view::npos) return std::string(path.substr(0, open));
  }
  // The last '.' outside brackets.
  int depth = 0;
  for (size_t i = path.size(); i > 0; --i) {
    char c = path[i - 1];
    if (c == ']') ++depth;
    if (c == '[') --depth;
    if (c == '.' && depth == 0) return std::string(path.substr(0, i - 1));
  }
  return "";
}

}  // namespace pscluster::scheduler
