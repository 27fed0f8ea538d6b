// The frame of a server checkpoint file (see checkpoint.proto for the layout): writing the head
// and trailer, verifying a whole file, and reading just the header of one on disk. Shared by the
// server (Job::MakeCheckpoint / Job::Restore) and the scheduler (choosing what a recovering job
// restores).
#ifndef PSCLUSTER_COMMON_CHECKPOINT_FILE_H_
#define PSCLUSTER_COMMON_CHECKPOINT_FILE_H_

#include <cstdint>
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

// Reads only the header of the checkpoint file at `path` (its magic checked, not its CRC: cheap,
// for choosing among many files; verify the chosen ones with ParseCheckpoint). NOT_FOUND or
// DATA_LOSS name the file. Read through `fs`.
absl::StatusOr<v1::CheckpointHeader> ReadCheckpointHeader(
    const std::string& path, FileSystem* fs = FileSystem::Default());

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_CHECKPOINT_FILE_H_
