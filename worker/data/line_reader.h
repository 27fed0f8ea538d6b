// The lines of one chunk of a data file, read through a bounded buffer.
//
// A plain file's chunk [begin, end) holds the lines that START in it: a reader of a chunk that
// does not begin the file skips the partial line before its first newline (the chunk before owns
// it), and the chunk's last line may run past `end`. So any cut of a file into chunks at any
// byte offsets reads every line exactly once. A gzip file is read whole, decompressed (several
// gzip members one after another are read as one stream).
#ifndef PSCLUSTER_WORKER_DATA_LINE_READER_H_
#define PSCLUSTER_WORKER_DATA_LINE_READER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/data_files.h"
#include "worker/data/file_system.h"

namespace pscluster::data {

struct LineReaderOptions {
  size_t max_line_bytes = 1 << 20;  // A longer line stops the reader (line_too_long()).
  size_t block_bytes = 1 << 20;     // Bytes read from the file at a time.
};

class LineReader {
 public:
  // REQUIRES: `file` is info.path opened, and outlives the reader; for gzip, begin == 0.
  LineReader(RandomAccessFile* file, const DataFile& info, uint64_t begin, uint64_t end,
             const LineReaderOptions& options);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line, without its '\n' and a '\r' before it; valid until the next call. False at
  // the end of the chunk or on an error (status() says which). A line longer than
  // max_line_bytes is read past (never held whole) and returned empty, with line_too_long().
  bool Next(absl::string_view* line);

  // OK, DATA_LOSS for broken gzip data, or the file system's error, naming the path.
  const absl::Status& status() const { return status_; }
  // Whether the line Next returned last was longer than max_line_bytes.
  bool line_too_long() const { return too_long_; }

  // Offset in the (decompressed) file of the last line's first byte.
  uint64_t line_offset() const { return line_offset_; }
  // Lines returned so far (blank lines too).
  uint64_t lines() const { return lines_; }
  // Bytes read from the file (compressed, for gzip).
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  class Inflater;

  // Reads more bytes after tail_, compacting first. False at the end of the stream or on error.
  bool Fill();
  // Drops bytes up to the next newline (or the end); the line it ends was too long.
  void DiscardRestOfLine();
  bool ReadPlain(char* dst, size_t space, size_t* got);

  RandomAccessFile* const file_;
  const std::string path_;
  const uint64_t end_;  // Plain: lines starting at or past it are not this chunk's.
  const bool gzip_;
  const LineReaderOptions options_;
  std::unique_ptr<Inflater> inflater_;

  std::vector<char> buf_;
  size_t head_ = 0;      // First byte not yet returned.
  size_t scan_ = 0;      // Bytes before it hold no newline (from head_).
  size_t tail_ = 0;      // End of the bytes in buf_.
  uint64_t buf_offset_;  // Stream offset of buf_[0].
  uint64_t file_pos_;    // Next byte to read from the file.
  bool skip_partial_;    // The partial line before the first newline is not ours.
  bool eof_ = false;
  bool done_ = false;
  bool too_long_ = false;
  absl::Status status_;
  uint64_t line_offset_ = 0;
  uint64_t lines_ = 0;
  uint64_t bytes_read_ = 0;
};

// Newlines in bytes [from, to) of a plain file (from 0: the 0-based number of the line at `to`).
absl::StatusOr<uint64_t> CountNewlines(RandomAccessFile* file, uint64_t from, uint64_t to);

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_LINE_READER_H_
