#include "common/checkpoint_file.h"

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

}  // namespace pscluster
