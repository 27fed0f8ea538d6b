#include "worker/data/line_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pscluster::data {
namespace {

// Read at a time past a chunk's end, for the rest of its last line.
constexpr size_t kTailBytes = 4096;

}  // namespace

// Decompresses a gzip file read through RandomAccessFile.
class LineReader::Inflater {
 public:
  Inflater(RandomAccessFile* file, const std::string& path) : file_(file), path_(path) {
    std::memset(&zs_, 0, sizeof(zs_));
    ok_ = inflateInit2(&zs_, 16 + MAX_WBITS) == Z_OK;
    in_.resize(256 << 10);
  }
  ~Inflater() {
    if (ok_) inflateEnd(&zs_);
  }

  // Up to `space` decompressed bytes into dst; 0 with an OK status at the end of the stream.
  absl::StatusOr<size_t> Read(char* dst, size_t space, uint64_t* bytes_read) {
    if (!ok_) return absl::ResourceExhaustedError(absl::StrCat(path_, ": cannot start zlib"));
    zs_.next_out = reinterpret_cast<Bytef*>(dst);
    zs_.avail_out = static_cast<uInt>(std::min<size_t>(space, 1u << 30));
    while (zs_.avail_out > 0) {
      if (zs_.avail_in == 0 && !file_eof_) {
        auto n = file_->Read(pos_, in_.size(), in_.data());
        if (!n.ok()) return n.status();
        pos_ += *n;
        *bytes_read += *n;
        if (*n == 0) file_eof_ = true;
        zs_.next_in = reinterpret_cast<Bytef*>(in_.data());
        zs_.avail_in = static_cast<uInt>(*n);
      }
      if (zs_.avail_in == 0 && file_eof_) {
        if (!member_done_) {
          return absl::DataLossError(absl::StrCat(path_, ": truncated gzip data"));
        }
        break;
      }
      if (member_done_) {  // Another gzip member follows.
        inflateReset(&zs_);
        member_done_ = false;
      }
      const uInt before = zs_.avail_out;
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        member_done_ = true;
      } else if (rc == Z_BUF_ERROR && zs_.avail_in == 0) {
        continue;  // Needs more input.
      } else if (rc != Z_OK) {
        return absl::DataLossError(absl::StrCat(
            path_, ": corrupt gzip data (zlib: ", zs_.msg != nullptr ? zs_.msg : "error", ")"));
      }
      if (zs_.avail_out < before) break;  // Return what came out.
    }
    return static_cast<size_t>(space - zs_.avail_out);
  }

 private:
  RandomAccessFile* const file_;
  const std::string path_;
  z_stream zs_;
  bool ok_ = false;
  std::vector<char> in_;
  uint64_t pos_ = 0;
  bool file_eof_ = false;
  bool member_done_ = false;
};

LineReader::LineReader(RandomAccessFile* file, const DataFile& info, uint64_t begin, uint64_t end,
                       const LineReaderOptions& options)
    : file_(file),
      path_(info.path),
      end_(end),
      gzip_(info.gzip),
      options_(options),
      buf_offset_(begin > 0 ? begin - 1 : 0),
      file_pos_(begin > 0 ? begin - 1 : 0),
      skip_partial_(begin > 0) {
  buf_.resize(options_.max_line_bytes + options_.block_bytes + 1);
  if (gzip_) inflater_ = std::make_unique<Inflater>(file, path_);
}

LineReader::~LineReader() = default;

bool LineReader::ReadPlain(char* dst, size_t space, size_t* got) {
  // Up to the chunk's end; past it only the rest of the last line is needed, a little at a time
  // (the next chunk reads those bytes again).
  size_t want = std::min<size_t>(space, kTailBytes);
  if (file_pos_ < end_) want = static_cast<size_t>(std::min<uint64_t>(space, end_ - file_pos_));
  auto n = file_->Read(file_pos_, want, dst);
  if (!n.ok()) {
    status_ = n.status();
    return false;
  }
  file_pos_ += *n;
  bytes_read_ += *n;
  *got = *n;
  return true;
}

bool LineReader::Fill() {
  if (head_ > 0) {
    std::memmove(buf_.data(), buf_.data() + head_, tail_ - head_);
    buf_offset_ += head_;
    tail_ -= head_;
    scan_ -= head_;
    head_ = 0;
  }
  const size_t space = std::min(buf_.size() - tail_, options_.block_bytes);
  size_t got = 0;
  if (gzip_) {
    auto n = inflater_->Read(buf_.data() + tail_, space, &bytes_read_);
    if (!n.ok()) {
      status_ = n.status();
      return false;
    }
    got = *n;
  } else if (!ReadPlain(buf_.data() + tail_, space, &got)) {
    return false;
  }
  if (got == 0) {
    eof_ = true;
    return false;
  }
  tail_ += got;
  return true;
}

void LineReader::DiscardRestOfLine() {
  while (true) {
    const char* nl =
        static_cast<const char*>(std::memchr(buf_.data() + scan_, '\n', tail_ - scan_));
    if (nl != nullptr) {
      head_ = scan_ = static_cast<size_t>(nl - buf_.data()) + 1;
      return;
    }
    head_ = scan_ = tail_;
    if (eof_ || !Fill()) return;
  }
}

bool LineReader::Next(absl::string_view* line) {
  if (done_) return false;
  too_long_ = false;
  while (skip_partial_) {
    const char* nl =
        static_cast<const char*>(std::memchr(buf_.data() + head_, '\n', tail_ - head_));
    if (nl != nullptr) {
      head_ = scan_ = static_cast<size_t>(nl - buf_.data()) + 1;
      skip_partial_ = false;
      break;
    }
    head_ = scan_ = tail_;
    if (!Fill()) {
      done_ = true;
      return false;
    }
  }
  while (true) {
    const uint64_t start = buf_offset_ + head_;
    if (!gzip_ && start >= end_) {
      done_ = true;
      return false;
    }
    const char* nl =
        static_cast<const char*>(std::memchr(buf_.data() + scan_, '\n', tail_ - scan_));
    size_t stop;
    if (nl != nullptr) {
      stop = static_cast<size_t>(nl - buf_.data());
    } else {
      scan_ = tail_;
      if (tail_ - head_ > options_.max_line_bytes) {
        stop = tail_;  // Too long already: read past it below.
      } else if (!eof_ && Fill()) {
        continue;
      } else if (!status_.ok() || head_ == tail_) {
        done_ = true;
        return false;
      } else {
        stop = tail_;  // The last line, with no newline after it.
      }
    }
    size_t len = stop - head_;
    line_offset_ = start;
    ++lines_;
    if (len > options_.max_line_bytes) {
      too_long_ = true;
      *line = absl::string_view();
      DiscardRestOfLine();
      if (!status_.ok()) {
        done_ = true;
        return false;
      }
      return true;
    }
    const char* p = buf_.data() + head_;
    if (len > 0 && p[len - 1] == '\r') --len;
    *line = absl::string_view(p, len);
    head_ = scan_ = stop < tail_ ? stop + 1 : tail_;
    return true;
  }
}

absl::StatusOr<uint64_t> CountNewlines(RandomAccessFile* file, uint64_t from, uint64_t to) {
  std::vector<char> buf(1 << 20);
  uint64_t count = 0;
  for (uint64_t pos = from; pos < to;) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), to - pos));
    auto n = file->Read(pos, want, buf.data());
    if (!n.ok()) return n.status();
    if (*n == 0) break;
    count += static_cast<uint64_t>(std::count(buf.data(), buf.data() + *n, '\n'));
    pos += *n;
  }
  return count;
}

}  // namespace pscluster::data
