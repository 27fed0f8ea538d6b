// The frame of a server checkpoint file (see checkpoint.proto for the layout): writing the head
// and trailer, verifying a whole file, and reading just the header of one on disk. Shared by the
// server (Job::MakeCheckpoint / Job::Restore) and the scheduler (choosing what a recovering job
// restores).
#ifndef PSCLUSTER_COMMON_CHECKPOINT_FILE_H_
#define PSCLUSTER_COMMON_CHECKPOINT_FILE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/checkpoint.pb.h"
#include "common/file_system.h"

namespace pscluster {

// Appends the magic, the header's length and the header; the data sections follow.
void AppendCheckpointHead(const v1::CheckpointHeader& header, std::string* file);
// Appends the trailer (CRC-32C of every byte before it, their count, the end marker) and
// returns the CRC.
uint32_t AppendCheckpointTrailer(std::string* file);

struct ParsedCheckpoint {
  v1::CheckpointHeader header;
  absl::string_view data;  // The data sections (points into the parsed bytes).
};

// Verifies the bytes of a whole checkpoint file: magic, trailer, length, CRC-32C, header and
// data length. A damaged file is DATA_LOSS "checkpoint PATH refused: WHAT; nothing was loaded".
absl::StatusOr<ParsedCheckpoint> ParseCheckpoint(absl::string_view file, absl::string_view path);

// Random access to the bytes of a checkpoint, so that a file larger than memory is verified and
// restored a piece at a time.
class CheckpointSource {
 public:
  virtual ~CheckpointSource() = default;
  virtual uint64_t size() const = 0;
  // The `n` bytes at `offset` (DATA_LOSS when the source ends first). The view stays valid until
  // the next Read into the same `scratch`.
  virtual absl::StatusOr<absl::string_view> Read(uint64_t offset, size_t n,
                                                 std::string* scratch) = 0;
};

// A checkpoint held in memory (views into `bytes`, no copies).
class StringCheckpointSource : public CheckpointSource {
 public:
  explicit StringCheckpointSource(absl::string_view bytes) : bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  absl::StatusOr<absl::string_view> Read(uint64_t offset, size_t n, std::string*) override;

 private:
  absl::string_view bytes_;
};

// The checkpoint file at `path`, read through `fs` piece by piece (FileSystem::ReadFileRange).
// Errors name the path.
absl::StatusOr<std::unique_ptr<CheckpointSource>> OpenCheckpointFile(FileSystem* fs,
                                                                     const std::string& path);

struct VerifiedCheckpoint {
  v1::CheckpointHeader header;
  uint64_t data_start = 0;  // Offset of the data sections in the source.
  uint64_t data_bytes = 0;
};

// ParseCheckpoint over a source: the same checks, the CRC computed over pieces of 8 MiB.
absl::StatusOr<VerifiedCheckpoint> VerifyCheckpoint(CheckpointSource& source,
                                                    absl::string_view path);

// Writes a checkpoint file in pieces to `sink` (a string, a file): Head, then the data sections
// with Append, then Finish (the trailer). Small appends are gathered into pieces of about 1 MiB;
// the CRC is computed as the bytes go.
class CheckpointWriter {
 public:
  using Sink = std::function<absl::Status(absl::string_view)>;
  explicit CheckpointWriter(Sink sink) : sink_(std::move(sink)) {}
  absl::Status Head(const v1::CheckpointHeader& header);
  absl::Status Append(absl::string_view data);
  // Writes the trailer; returns the CRC-32C of every byte before it.
  absl::StatusOr<uint32_t> Finish();
  uint64_t bytes() const { return bytes_; }  // Written so far (Head, data, trailer).

 private:
  absl::Status Flush();
  Sink sink_;
  std::string buffer_;
  uint32_t crc_ = 0;
  uint64_t bytes_ = 0;
};

// Reads only the header of the checkpoint file at `path` (its magic checked, not its CRC: cheap,
// for choosing among many files; verify the chosen ones with ParseCheckpoint). NOT_FOUND or
// DATA_LOSS name the file. Read through `fs`.
absl::StatusOr<v1::CheckpointHeader> ReadCheckpointHeader(
    const std::string& path, FileSystem* fs = FileSystem::Default());
// The same, from a source (one already verified, say: nothing is read but the header).
absl::StatusOr<v1::CheckpointHeader> ReadCheckpointHeader(CheckpointSource& source,
                                                          absl::string_view path);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_CHECKPOINT_FILE_H_
