#include "common/checkpoint_file.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"

namespace pscluster {
namespace {

constexpr char kHeadMagic[] = "PSCKPT01";
constexpr char kTailMagic[] = "PSCKEND1";
constexpr size_t kHeadBytes = 16;            // Magic and header length.
constexpr size_t kTrailerBytes = 4 + 8 + 8;  // CRC, body length, end marker.
// A header describes tables and blocks, not data: anything near this is damage.
constexpr uint64_t kMaxHeaderBytes = uint64_t{1} << 30;

void PutLe64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetLe64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

absl::Status Refused(absl::string_view path, absl::string_view what) {
  return absl::DataLossError(
      absl::StrCat("checkpoint ", path, " refused: ", what, "; nothing was loaded"));
}

}  // namespace

void AppendCheckpointHead(const v1::CheckpointHeader& header, std::string* file) {
  std::string h = header.SerializeAsString();
  file->append(kHeadMagic, 8);
  PutLe64(file, h.size());
  file->append(h);
}

uint32_t AppendCheckpointTrailer(std::string* file) {
  const uint64_t body = file->size();
  const uint32_t crc = Crc32c(*file);
  for (int i = 0; i < 4; ++i) file->push_back(static_cast<char>((crc >> (8 * i)) & 0xff));
  PutLe64(file, body);
  file->append(kTailMagic, 8);
  return crc;
}

absl::StatusOr<ParsedCheckpoint> ParseCheckpoint(absl::string_view f, absl::string_view path) {
  if (f.size() < kHeadBytes + kTrailerBytes || f.substr(0, 8) != absl::string_view(kHeadMagic, 8)) {
    return Refused(path, absl::StrCat("not a pscluster checkpoint (", f.size(), " bytes, bad magic)"));
  }
  if (f.substr(f.size() - 8) != absl::string_view(kTailMagic, 8)) {
    return Refused(path, "truncated: the end marker is missing");
  }
  const uint64_t body = GetLe64(f.data() + f.size() - 16);
  if (body != f.size() - kTrailerBytes) {
    return Refused(path, absl::StrCat("truncated or padded: trailer says ", body,
                                      " bytes, file has ", f.size() - kTrailerBytes));
  }
  uint32_t stored = 0;
  for (int i = 0; i < 4; ++i) {
    stored |= static_cast<uint32_t>(static_cast<uint8_t>(f[body + i])) << (8 * i);
  }
  const uint32_t computed = Crc32c(f.substr(0, body));
  if (stored != computed) {
    return Refused(path, absl::StrCat("checksum mismatch (stored crc32c ", stored, ", computed ",
                                      computed, ")"));
  }
  const uint64_t hlen = GetLe64(f.data() + 8);
  if (hlen > body - kHeadBytes) return Refused(path, "header length exceeds the file");
  ParsedCheckpoint out;
  if (!out.header.ParseFromArray(f.data() + kHeadBytes, static_cast<int>(hlen))) {
    return Refused(path, "header unreadable");
  }
  const uint64_t data_start = kHeadBytes + hlen;
  if (out.header.data_bytes() != body - data_start) {
    return Refused(path, "data section length mismatch");
  }
  out.data = f.substr(data_start, body - data_start);
  return out;
}

absl::StatusOr<absl::string_view> StringCheckpointSource::Read(uint64_t offset, size_t n,
                                                               std::string*) {
  if (offset > bytes_.size() || n > bytes_.size() - offset) {
    return absl::DataLossError(absl::StrCat("reading ", n, " bytes at ", offset, " past the end (",
                                            bytes_.size(), " bytes)"));
  }
  return bytes_.substr(offset, n);
}

namespace {

class FileCheckpointSource : public CheckpointSource {
 public:
  FileCheckpointSource(FileSystem* fs, std::string path, uint64_t size)
      : fs_(fs), path_(std::move(path)), size_(size) {}
  uint64_t size() const override { return size_; }
  absl::StatusOr<absl::string_view> Read(uint64_t offset, size_t n,
                                         std::string* scratch) override {
    if (offset > size_ || n > size_ - offset) {
      return absl::DataLossError(absl::StrCat("checkpoint ", path_, ": reading ", n,
                                              " bytes at ", offset, " past its end (", size_,
                                              " bytes)"));
    }
    auto got = fs_->ReadFileRange(path_, offset, n);
    if (!got.ok()) return got.status();
    if (got->size() != n) {
      return absl::DataLossError(absl::StrCat("checkpoint ", path_, " shrank while being read (",
                                              got->size(), " of ", n, " bytes at ", offset, ")"));
    }
    *scratch = std::move(*got);
    return absl::string_view(*scratch);
  }

 private:
  FileSystem* const fs_;
  const std::string path_;
  const uint64_t size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointSource>> OpenCheckpointFile(FileSystem* fs,
                                                                     const std::string& path) {
  auto size = fs->FileSize(path);
  if (!size.ok()) return size.status();
  return std::unique_ptr<CheckpointSource>(new FileCheckpointSource(fs, path, *size));
}

absl::StatusOr<VerifiedCheckpoint> VerifyCheckpoint(CheckpointSource& src,
                                                    absl::string_view path) {
  const uint64_t size = src.size();
  std::string scratch;
  if (size < kHeadBytes + kTrailerBytes) {
    return Refused(path, absl::StrCat("not a pscluster checkpoint (", size, " bytes, bad magic)"));
  }
  auto head = src.Read(0, kHeadBytes, &scratch);
  if (!head.ok()) return head.status();
  if (head->substr(0, 8) != absl::string_view(kHeadMagic, 8)) {
    return Refused(path, absl::StrCat("not a pscluster checkpoint (", size, " bytes, bad magic)"));
  }
  const uint64_t hlen = GetLe64(head->data() + 8);
  std::string tail_scratch;
  auto tail = src.Read(size - kTrailerBytes, kTrailerBytes, &tail_scratch);
  if (!tail.ok()) return tail.status();
  if (tail->substr(kTrailerBytes - 8) != absl::string_view(kTailMagic, 8)) {
    return Refused(path, "truncated: the end marker is missing");
  }
  const uint64_t body = GetLe64(tail->data() + 4);
  if (body != size - kTrailerBytes) {
    return Refused(path, absl::StrCat("truncated or padded: trailer says ", body,
                                      " bytes, file has ", size - kTrailerBytes));
  }
  uint32_t stored = 0;
  for (int i = 0; i < 4; ++i) {
    stored |= static_cast<uint32_t>(static_cast<uint8_t>((*tail)[i])) << (8 * i);
  }
  constexpr uint64_t kPiece = uint64_t{8} << 20;
  uint32_t computed = 0;
  for (uint64_t off = 0; off < body; off += kPiece) {
    const size_t n = static_cast<size_t>(std::min(kPiece, body - off));
    auto piece = src.Read(off, n, &scratch);
    if (!piece.ok()) return piece.status();
    computed = Crc32cExtend(computed, piece->data(), piece->size());
  }
  if (stored != computed) {
    return Refused(path, absl::StrCat("checksum mismatch (stored crc32c ", stored, ", computed ",
                                      computed, ")"));
  }
  if (hlen > body - kHeadBytes) return Refused(path, "header length exceeds the file");
  VerifiedCheckpoint out;
  auto h = src.Read(kHeadBytes, static_cast<size_t>(hlen), &scratch);
  if (!h.ok()) return h.status();
  if (!out.header.ParseFromArray(h->data(), static_cast<int>(hlen))) {
    return Refused(path, "header unreadable");
  }
  out.data_start = kHeadBytes + hlen;
  out.data_bytes = body - out.data_start;
  if (out.header.data_bytes() != out.data_bytes) {
    return Refused(path, "data section length mismatch");
  }
  return out;
}

absl::Status CheckpointWriter::Head(const v1::CheckpointHeader& header) {
  std::string head;
  AppendCheckpointHead(header, &head);
  return Append(head);
}

absl::Status CheckpointWriter::Flush() {
  if (buffer_.empty()) return absl::OkStatus();
  absl::Status s = sink_(buffer_);
  buffer_.clear();
  return s;
}

absl::Status CheckpointWriter::Append(absl::string_view data) {
  constexpr size_t kPiece = size_t{1} << 20;
  crc_ = Crc32cExtend(crc_, data.data(), data.size());
  bytes_ += data.size();
  if (buffer_.size() + data.size() <= kPiece) {
    buffer_.append(data.data(), data.size());
    return absl::OkStatus();
  }
  absl::Status s = Flush();
  if (!s.ok()) return s;
  if (data.size() >= kPiece) return sink_(data);  // Large pieces go as they are.
  buffer_.append(data.data(), data.size());
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> CheckpointWriter::Finish() {
  std::string trailer;
  for (int i = 0; i < 4; ++i) trailer.push_back(static_cast<char>((crc_ >> (8 * i)) & 0xff));
  PutLe64(&trailer, bytes_);
  trailer.append(kTailMagic, 8);
  const uint32_t crc = crc_;
  bytes_ += trailer.size();
  buffer_.append(trailer);
  absl::Status s = Flush();
  if (!s.ok()) return s;
  return crc;
}

absl::StatusOr<v1::CheckpointHeader> ReadCheckpointHeader(const std::string& path,
                                                          FileSystem* fs) {
  auto head = fs->ReadFileRange(path, 0, kHeadBytes);
  if (!head.ok()) {
    return absl::Status(head.status().code(),
                        absl::StrCat("checkpoint ", path, ": ", head.status().message()));
  }
  if (head->size() < kHeadBytes || absl::string_view(*head).substr(0, 8) !=
                                       absl::string_view(kHeadMagic, 8)) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": not a pscluster checkpoint"));
  }
  const uint64_t hlen = GetLe64(head->data() + 8);
  if (hlen > kMaxHeaderBytes) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": header length ", hlen,
                                            " is not plausible"));
  }
  auto h = fs->ReadFileRange(path, kHeadBytes, hlen);
  if (!h.ok()) {
    return absl::Status(h.status().code(),
                        absl::StrCat("checkpoint ", path, ": ", h.status().message()));
  }
  v1::CheckpointHeader header;
  if (h->size() != hlen || !header.ParseFromString(*h)) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": header truncated or unreadable"));
  }
  return header;
}

absl::StatusOr<v1::CheckpointHeader> ReadCheckpointHeader(CheckpointSource& source,
                                                          absl::string_view path) {
  std::string scratch;
  if (source.size() < kHeadBytes) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": not a pscluster checkpoint"));
  }
  auto head = source.Read(0, kHeadBytes, &scratch);
  if (!head.ok()) return head.status();
  if (head->substr(0, 8) != absl::string_view(kHeadMagic, 8)) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": not a pscluster checkpoint"));
  }
  const uint64_t hlen = GetLe64(head->data() + 8);
  if (hlen > kMaxHeaderBytes || hlen > source.size() - kHeadBytes) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": header length ", hlen,
                                            " is not plausible"));
  }
  auto h = source.Read(kHeadBytes, hlen, &scratch);
  if (!h.ok()) return h.status();
  v1::CheckpointHeader header;
  if (!header.ParseFromArray(h->data(), static_cast<int>(h->size()))) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": header truncated or unreadable"));
  }
  return header;
}

}  // namespace pscluster
