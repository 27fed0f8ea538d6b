// Test helpers for the streaming readers: temporary files (plain and gzip), the lines a reader
// should see, every example of a pass as comparable strings, and a file system that fails reads.
#ifndef PSCLUSTER_WORKER_DATA_TEST_FILES_H_
#define PSCLUSTER_WORKER_DATA_TEST_FILES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/example.h"
#include "worker/data/file_system.h"
#include "worker/data/stream_reader.h"

namespace pscluster::data::testing {

// A new empty directory under TEST_TMPDIR (or /tmp).
std::string NewTempDir(const std::string& name);

// Writes `text` to `path` (gzip: in `members` gzip members one after another). Aborts the test
// binary if the file cannot be written.
void WriteText(const std::string& path, absl::string_view text);
void WriteGzip(const std::string& path, absl::string_view text, int members = 1);

// `n` Criteo lines (label, 13 integer features, 26 hex categorical values) drawn with `seed`,
// whose label is 1 exactly when C2 is one of three of its ten values or I1 is large (50 or
// more; the other I1 values are 0-2): what a wide part and an mlp can each learn. Every field
// takes ten values, so a few hundred lines use every key.
std::string PlantedCriteoLines(int n, uint64_t seed);

// The lines of `text` as a LineReader returns them: split at '\n', a '\r' before it dropped, no
// line after a final newline.
std::vector<std::string> SplitLines(absl::string_view text);

// "label|d0,d1|k:v,k:v" for each example.
std::vector<std::string> Signatures(const ExampleBatch& batch);
std::string Signature(const Example& e);

// Every example of a pass, in order, `batch` at a time; the pass's error if it fails.
absl::StatusOr<std::vector<std::string>> ReadAll(StreamReader* reader, size_t batch = 7);

// Wraps a file system; reads of `path` at or past `fail_at` return `error`.
class FaultyFileSystem final : public FileSystem {
 public:
  FaultyFileSystem(FileSystem* base, std::string path, uint64_t fail_at, absl::Status error)
      : base_(base), path_(std::move(path)), fail_at_(fail_at), error_(std::move(error)) {}

  absl::StatusOr<FileStat> Stat(const std::string& path) override { return base_->Stat(path); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    return base_->ListDir(dir);
  }
  absl::StatusOr<std::vector<std::string>> Glob(const std::string& pattern) override {
    return base_->Glob(pattern);
  }
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> Open(const std::string& path) override;

 private:
  FileSystem* const base_;
  const std::string path_;
  const uint64_t fail_at_;
  const absl::Status error_;
};

}  // namespace pscluster::data::testing

#endif  // PSCLUSTER_WORKER_DATA_TEST_FILES_H_
