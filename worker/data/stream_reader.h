// Streams one pass (an epoch) over a rank's chunks of a data set: a reader thread reads the
// chunks' lines, keeps one side of the held-out split, parses, shuffles through a window and
// hands blocks of examples to the trainer through a bounded queue. Memory is bounded by the
// options, never by the data's size: about (shuffle_window + (prefetch_batches + 2) *
// batch_examples) examples, plus one line buffer of max_line_bytes + 1 MiB (and 256 KiB of zlib
// input for a gzip file).
//
// Thread model: one reader thread, started by the constructor and joined by the destructor.
// Next() is called from one thread at a time (the consumer); AddChunks() and stats() from any.
// The output depends only on the config (chunks, seeds, window): the same config gives the same
// examples in the same order.
#ifndef PSCLUSTER_WORKER_DATA_STREAM_READER_H_
#define PSCLUSTER_WORKER_DATA_STREAM_READER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/data/chunks.h"
#include "worker/data/data_files.h"
#include "worker/data/dataset_options.h"
#include "worker/data/example.h"
#include "worker/data/file_system.h"
#include "worker/data/line_parser.h"
#include "worker/data/line_reader.h"
#include "worker/data/shuffle_window.h"

namespace pscluster::data {

struct StreamConfig {
  std::string key = "train";           // Names the data in messages ("train", "test").
  const DataLayout* layout = nullptr;  // Outlives the reader.
  const LineParser* parser = nullptr;  // Outlives the reader.
  FileSystem* fs = nullptr;            // Outlives the reader.
  std::vector<Chunk> chunks;           // In reading order.
  // With holdout_fraction > 0, a line is held out when HashBytes(line, holdout_seed) falls in
  // the fraction; the reader keeps the held-out lines (test) or the others (train).
  double holdout_fraction = 0;
  uint64_t holdout_seed = 0;
  bool keep_held_out = false;
  uint32_t shuffle_window = 0;  // 0 or 1: reading order.
  uint64_t shuffle_seed = 0;
  uint64_t skip_examples = 0;  // Dropped from the front of the output (resuming mid-epoch).
  OnError on_error = OnError::kFail;
  double max_error_fraction = 0;
  uint32_t batch_examples = 1024;
  uint32_t prefetch_batches = 8;
  LineReaderOptions line_options;
};

// The held-out threshold: a line is held out when its hash is below it.
uint64_t HoldoutThreshold(double fraction);

struct ReaderStats {
  uint64_t bytes_read = 0;                // File bytes read (compressed for gzip).
  uint64_t lines = 0;                     // Lines with data on this reader's side of the split.
  uint64_t skipped_lines = 0;             // Malformed lines skipped (on_error: skip).
  uint64_t examples = 0;                  // Examples handed out by Next.
  std::vector<std::string> first_errors;  // "file:line:column: expected ...", the first few.
  bool finished = false;  // The reader thread is done (all chunks read, or an error).
};

class StreamReader {
 public:
  // The most malformed-line messages kept (each costs a count of the lines before it).
  static constexpr size_t kMaxErrorMessages = 5;
  // Lines read before max_error_fraction is checked mid-pass.
  static constexpr uint64_t kMinLinesForFraction = 1000;

  // Starts the reader thread. REQUIRES: the config's pointers are set.
  explicit StreamReader(StreamConfig config);
  ~StreamReader();
  StreamReader(const StreamReader&) = delete;
  StreamReader& operator=(const StreamReader&) = delete;

  // Up to `max` examples into *out (cleared first; dense_dim set from the schema): fewer only at
  // the end of the pass, 0 there. After the examples read before it, the read's error: DATA_LOSS
  // "file:line:column: expected ..." (on_error: fail) or for too many skipped lines, or the
  // file system's error naming the file.
  absl::StatusOr<size_t> Next(size_t max, ExampleBatch* out);

  // Chunks to read in this pass too, after those already queued (a part handed to this rank by
  // one that left). FAILED_PRECONDITION once the reader has started on its last chunk's end
  // (the part is then read from the next pass).
  absl::Status AddChunks(const std::vector<Chunk>& chunks);

  ReaderStats stats() const;
  const Schema& schema() const { return config_.parser->schema(); }

 private:
  void Run();
  absl::Status ReadChunks();
  absl::Status ReadChunk(const Chunk& chunk, RandomAccessFile* file);
  // A malformed line: fails, or counts it and fails past the fraction.
  absl::Status Malformed(const Chunk& chunk, RandomAccessFile* file, const LineReader& lines,
                         size_t column, const std::string& expected);
  absl::StatusOr<uint64_t> LineNumber(const Chunk& chunk, RandomAccessFile* file,
                                      const LineReader& lines);
  absl::Status CheckFraction(bool at_end);
  // Hands an example to the output (after skip_examples); false when cancelled.
  bool Emit(const Example& e);
  bool PushBlock();
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CanPush() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CanPop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const StreamConfig config_;
  const uint64_t holdout_threshold_;

  // Reader thread only.
  ShuffleWindow window_;
  Example scratch_;
  ExampleBatch block_;
  uint64_t to_skip_;
  uint64_t lines_ = 0, skipped_ = 0, bytes_done_ = 0;
  uint64_t chunk_bytes_ = 0;  // Read so far in the current chunk.
  std::vector<std::string> errors_;

  // Consumer only.
  ExampleBatch current_;
  size_t cursor_ = 0;

  mutable absl::Mutex mu_;
  std::deque<Chunk> pending_ ABSL_GUARDED_BY(mu_);
  bool chunks_closed_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<ExampleBatch> ready_ ABSL_GUARDED_BY(mu_);
  std::vector<ExampleBatch> free_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);
  ReaderStats stats_ ABSL_GUARDED_BY(mu_);

  std::thread thread_;  // Last: started when everything above is ready.
};

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_STREAM_READER_H_
