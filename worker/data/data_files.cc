#include "worker/data/data_files.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/data/text_scan.h"

namespace pscluster::data {
namespace {

absl::Status Prefixed(absl::string_view key, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(key, ": ", s.message()));
}

absl::StatusOr<bool> IsGzip(FileSystem* fs, const std::string& path, uint64_t size) {
  if (size < 2) return false;
  auto file = fs->Open(path);
  if (!file.ok()) return file.status();
  char magic[2];
  auto n = (*file)->Read(0, 2, magic);
  if (!n.ok()) return n.status();
  return *n == 2 && static_cast<unsigned char>(magic[0]) == 0x1f &&
         static_cast<unsigned char>(magic[1]) == 0x8b;
}

}  // namespace

bool IsGlob(absl::string_view path) { return path.find_first_of("*?[") != absl::string_view::npos; }

uint64_t DataLayout::Fingerprint() const {
  uint64_t h = HashBytes(source, 0x5eed);
  for (const DataFile& f : files) {
    h = HashBytes(f.path, h);
    h = HashBytes(absl::StrCat(f.size, f.gzip ? "z" : "p"), h);
  }
  return h;
}

absl::StatusOr<DataLayout> ListDataFiles(FileSystem* fs, absl::string_view key,
                                         const std::string& source) {
  if (source.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": a file, a directory or a glob is needed"));
  }
  DataLayout layout;
  layout.source = source;
  std::vector<std::string> candidates;
  if (IsGlob(source)) {
    auto paths = fs->Glob(source);
    if (!paths.ok()) return Prefixed(key, paths.status());
    candidates = std::move(*paths);
    if (candidates.empty()) {
      return absl::NotFoundError(absl::StrCat(key, ": ", source, " matches no file"));
    }
  } else {
    auto st = fs->Stat(source);
    if (!st.ok()) return Prefixed(key, st.status());
    if (st->is_dir) {
      auto names = fs->ListDir(source);
      if (!names.ok()) return Prefixed(key, names.status());
      const std::string dir = source.back() == '/' ? source : source + "/";
      for (const std::string& name : *names) {
        if (name[0] == '.' || name[0] == '_') continue;
        candidates.push_back(dir + name);
      }
      std::sort(candidates.begin(), candidates.end());
    } else {
      candidates.push_back(source);
    }
  }
  for (const std::string& path : candidates) {
    auto st = fs->Stat(path);
    if (!st.ok()) return Prefixed(key, st.status());
    if (st->is_dir) continue;
    auto gz = IsGzip(fs, path, st->size);
    if (!gz.ok()) return Prefixed(key, gz.status());
    layout.files.push_back({path, st->size, *gz});
    layout.total_bytes += st->size;
  }
  if (layout.files.empty()) {
    return absl::NotFoundError(absl::StrCat(key, ": ", source, " holds no data files"));
  }
  return layout;
}

}  // namespace pscluster::data
