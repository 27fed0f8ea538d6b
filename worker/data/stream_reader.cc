#include "worker/data/stream_reader.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/data/text_scan.h"

namespace pscluster::data {

uint64_t HoldoutThreshold(double fraction) {
  if (!(fraction > 0)) return 0;
  if (fraction >= 1) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(static_cast<long double>(fraction) * 18446744073709551616.0L);
}

StreamReader::StreamReader(StreamConfig config)
    : config_(std::move(config)),
      holdout_threshold_(HoldoutThreshold(config_.holdout_fraction)),
      window_(config_.shuffle_window, config_.shuffle_seed),
      to_skip_(config_.skip_examples) {
  block_.dense_dim = static_cast<uint32_t>(schema().dense.size());
  current_.dense_dim = block_.dense_dim;
  {
    absl::MutexLock l(&mu_);
    pending_.assign(config_.chunks.begin(), config_.chunks.end());
  }
  thread_ = std::thread(&StreamReader::Run, this);
}

StreamReader::~StreamReader() {
  {
    absl::MutexLock l(&mu_);
    cancelled_ = true;
  }
  thread_.join();
}

bool StreamReader::CanPush() const {
  return cancelled_ || ready_.size() < config_.prefetch_batches;
}

bool StreamReader::CanPop() const { return finished_ || !ready_.empty(); }

absl::Status StreamReader::AddChunks(const std::vector<Chunk>& chunks) {
  absl::MutexLock l(&mu_);
  if (chunks_closed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        config_.key, ": this pass has read all its chunks; the added part is read from the next"));
  }
  pending_.insert(pending_.end(), chunks.begin(), chunks.end());
  return absl::OkStatus();
}

ReaderStats StreamReader::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

void StreamReader::Publish() {
  stats_.bytes_read = bytes_done_ + chunk_bytes_;
  stats_.lines = lines_;
  stats_.skipped_lines = skipped_;
  if (stats_.first_errors.size() != errors_.size()) stats_.first_errors = errors_;
}

bool StreamReader::PushBlock() {
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(this, &StreamReader::CanPush));
  if (cancelled_) return false;
  Publish();
  if (block_.size() == 0) return true;
  ready_.push_back(std::move(block_));
  if (!free_.empty()) {
    block_ = std::move(free_.back());
    free_.pop_back();
  } else {
    block_ = ExampleBatch();
  }
  block_.Clear();
  block_.dense_dim = static_cast<uint32_t>(schema().dense.size());
  return true;
}

bool StreamReader::Emit(const Example& e) {
  if (to_skip_ > 0) {
    --to_skip_;
    return true;
  }
  block_.Append(e);
  return block_.size() < config_.batch_examples || PushBlock();
}

void StreamReader::Run() {
  absl::Status s = ReadChunks();
  while (s.ok() && window_.Drain(&scratch_)) {
    if (!Emit(scratch_)) s = absl::CancelledError("stopped");
  }
  if (s.ok()) s = CheckFraction(/*at_end=*/true);
  // The examples read before an error still go out, then the error.
  if (!absl::IsCancelled(s) && !PushBlock()) s = absl::CancelledError("stopped");
  absl::MutexLock l(&mu_);
  Publish();
  stats_.finished = true;
  finished_ = true;
  final_status_ = s;
}

absl::Status StreamReader::ReadChunks() {
  uint32_t open_file = std::numeric_limits<uint32_t>::max();
  std::unique_ptr<RandomAccessFile> file;
  while (true) {
    Chunk chunk;
    {
      absl::MutexLock l(&mu_);
      if (cancelled_) return absl::CancelledError("stopped");
      if (pending_.empty()) {
        chunks_closed_ = true;
        return absl::OkStatus();
      }
      chunk = pending_.front();
      pending_.pop_front();
    }
    if (chunk.file != open_file) {
      const DataFile& info = config_.layout->files[chunk.file];
      auto f = config_.fs->Open(info.path);
      if (!f.ok()) {
        return absl::Status(f.status().code(),
                            absl::StrCat(config_.key, ": ", f.status().message()));
      }
      file = std::move(*f);
      open_file = chunk.file;
    }
    absl::Status s = ReadChunk(chunk, file.get());
    if (!s.ok()) return s;
  }
}

absl::Status StreamReader::ReadChunk(const Chunk& chunk, RandomAccessFile* file) {
  const DataFile& info = config_.layout->files[chunk.file];
  const LineParser& parser = *config_.parser;
  LineReader lines(file, info, chunk.begin, chunk.end, config_.line_options);
  const bool header = parser.has_header() && chunk.begin == 0;
  const bool holdout = config_.holdout_fraction > 0;
  const std::string too_long =
      absl::StrCat("expected a line of at most ", config_.line_options.max_line_bytes,
                   " bytes (max_line_bytes), found a longer one");
  absl::string_view line;
  ParseError error;
  while (lines.Next(&line)) {
    chunk_bytes_ = lines.bytes_read();
    if (header && lines.lines() == 1) {
      if (lines.line_too_long()) {
        return absl::DataLossError(absl::StrCat(info.path, ":1:1: ", too_long));
      }
      if (!parser.CheckHeader(line, &error)) {
        return absl::DataLossError(
            absl::StrCat(info.path, ":1:", error.column, ": ", error.expected));
      }
      continue;
    }
    if (holdout &&
        (HashBytes(line, config_.holdout_seed) < holdout_threshold_) != config_.keep_held_out) {
      continue;
    }
    if (lines.line_too_long()) {
      ++lines_;
      absl::Status s = Malformed(chunk, file, lines, 1, too_long);
      if (!s.ok()) return s;
      continue;
    }
    const ParseOutcome outcome = parser.Parse(line, &scratch_, &error);
    if (outcome == ParseOutcome::kNoData) continue;
    ++lines_;
    if (outcome == ParseOutcome::kError) {
      absl::Status s = Malformed(chunk, file, lines, error.column, error.expected);
      if (!s.ok()) return s;
      continue;
    }
    if (window_.Push(&scratch_) && !Emit(scratch_)) return absl::CancelledError("stopped");
  }
  bytes_done_ += lines.bytes_read();
  chunk_bytes_ = 0;
  if (!lines.status().ok()) {
    return absl::Status(lines.status().code(),
                        absl::StrCat(config_.key, ": ", lines.status().message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> StreamReader::LineNumber(const Chunk& chunk, RandomAccessFile* file,
                                                  const LineReader& lines) {
  if (chunk.begin == 0) return lines.lines();
  // The chunk starts inside the file: count the lines before this one (on errors only).
  auto before = CountNewlines(file, 0, lines.line_offset());
  if (!before.ok()) return before.status();
  return *before + 1;
}

absl::Status StreamReader::Malformed(const Chunk& chunk, RandomAccessFile* file,
                                     const LineReader& lines, size_t column,
                                     const std::string& expected) {
  const bool fail = config_.on_error == OnError::kFail;
  if (fail || errors_.size() < kMaxErrorMessages) {
    auto line = LineNumber(chunk, file, lines);
    if (!line.ok()) return line.status();
    std::string message = absl::StrCat(config_.layout->files[chunk.file].path, ":", *line, ":",
                                       column, ": ", expected);
    if (fail) return absl::DataLossError(message);
    errors_.push_back(std::move(message));
  }
  ++skipped_;
  return CheckFraction(/*at_end=*/false);
}

absl::Status StreamReader::CheckFraction(bool at_end) {
  if (config_.on_error != OnError::kSkip || skipped_ == 0) return absl::OkStatus();
  if (!at_end && lines_ < kMinLinesForFraction) return absl::OkStatus();
  if (static_cast<double>(skipped_) <= config_.max_error_fraction * static_cast<double>(lines_)) {
    return absl::OkStatus();
  }
  return absl::DataLossError(absl::StrFormat(
      "%s: %d of %d lines malformed (%.3g%%), more than max_error_fraction %g; the first: %s",
      config_.key, skipped_, lines_, 100.0 * static_cast<double>(skipped_) / lines_,
      config_.max_error_fraction, errors_.empty() ? "" : errors_.front()));
}

absl::StatusOr<size_t> StreamReader::Next(size_t max, ExampleBatch* out) {
  out->Clear();
  out->dense_dim = current_.dense_dim;
  while (out->size() < max) {
    if (cursor_ >= current_.size()) {
      absl::MutexLock l(&mu_);
      if (current_.labels.capacity() > 0) free_.push_back(std::move(current_));
      current_ = ExampleBatch();
      current_.dense_dim = out->dense_dim;
      cursor_ = 0;
      mu_.Await(absl::Condition(this, &StreamReader::CanPop));
      if (ready_.empty()) {
        if (!final_status_.ok() && out->size() == 0) return final_status_;
        break;
      }
      current_ = std::move(ready_.front());
      ready_.pop_front();
    }
    const size_t n = std::min(max - out->size(), current_.size() - cursor_);
    for (size_t i = 0; i < n; ++i) out->AppendFrom(current_, cursor_ + i);
    cursor_ += n;
  }
  absl::MutexLock l(&mu_);
  stats_.examples += out->size();
  return out->size();
}

}  // namespace pscluster::data
