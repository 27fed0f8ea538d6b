#include "server/wire.h"

#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pscluster {
namespace {

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Reads a sequence of slices as one byte stream.
class Cursor {
 public:
  explicit Cursor(const std::vector<grpc::Slice>& slices) : slices_(slices) { SkipEmpty(); }

  bool done() const { return i_ >= slices_.size(); }

  bool Byte(uint8_t* b) {
    if (done()) return false;
    *b = slices_[i_].begin()[off_];
    Advance(1);
    return true;
  }

  bool Varint(uint64_t* v, std::string* raw) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      if (raw) raw->push_back(static_cast<char>(b));
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }

  // Moves n bytes forward, appending them to `copy` or their pieces to `pieces`.
  bool Take(uint64_t n, std::string* copy, std::vector<absl::string_view>* pieces) {
    while (n > 0) {
      if (done()) return false;
      const grpc::Slice& s = slices_[i_];
      size_t avail = s.size() - off_;
      size_t k = n < avail ? static_cast<size_t>(n) : avail;
      const char* p = reinterpret_cast<const char*>(s.begin()) + off_;
      if (copy) copy->append(p, k);
      if (pieces) pieces->emplace_back(p, k);
      Advance(k);
      n -= k;
    }
    return true;
  }

 private:
  void Advance(size_t k) {
    off_ += k;
    if (off_ == slices_[i_].size()) {
      ++i_;
      off_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (i_ < slices_.size() && slices_[i_].size() == 0) ++i_;
  }

  const std::vector<grpc::Slice>& slices_;
  size_t i_ = 0;
  size_t off_ = 0;
};

// Chosen with tests/bench/ps_bench on loopback: a large stream window and 4 MiB frames let a
// 4 MiB chunk travel without waiting for window updates or being cut into 16 KiB frames, and
// large TCP reads cut the number of read calls per chunk.
std::vector<std::pair<std::string, int>> kDataPlaneArgs() {
  return {
      {"grpc.http2.lookahead_bytes", 64 << 20},
      {"grpc.http2.max_frame_size", 4 << 20},
      {"grpc.experimental.tcp_read_chunk_size", 4 << 20},
      {"grpc.experimental.tcp_min_read_chunk_size", 1 << 20},
      {"grpc.experimental.tcp_max_read_chunk_size", 16 << 20},
  };
}

}  // namespace

grpc::ByteBuffer EncodeWithPayload(const google::protobuf::MessageLite& header, int payload_field,
                                   std::vector<grpc::Slice> payload) {
  std::string head;
  header.SerializeToString(&head);
  size_t total = 0;
  for (const auto& s : payload) total += s.size();
  std::vector<grpc::Slice> slices;
  slices.reserve(payload.size() + 1);
  if (total > 0) {
    PutVarint(&head, (static_cast<uint64_t>(payload_field) << 3) | 2);
    PutVarint(&head, total);
  }
  slices.emplace_back(head);
  if (total > 0) {
    for (auto& s : payload) {
      if (s.size() > 0) slices.push_back(std::move(s));
    }
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

absl::Status DecodeWithPayload(const grpc::ByteBuffer& buf, int payload_field,
                               google::protobuf::MessageLite* header, Payload* payload,
                               absl::string_view what) {
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  if (!buf.Dump(slices.get()).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": unreadable message"));
  }
  auto malformed = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": malformed message (", why, ")"));
  };
  Cursor c(*slices);
  std::string head;
  std::vector<absl::string_view> pieces;
  while (!c.done()) {
    uint64_t tag;
    std::string raw;
    if (!c.Varint(&tag, &raw)) return malformed("bad field tag");
    const uint64_t field = tag >> 3;
    const int type = static_cast<int>(tag & 7);
    switch (type) {
      case 0: {
        uint64_t v;
        if (!c.Varint(&v, &raw)) return malformed("bad varint");
        head.append(raw);
        break;
      }
      case 1:
      case 5:
        head.append(raw);
        if (!c.Take(type == 1 ? 8 : 4, &head, nullptr)) return malformed("truncated");
        break;
      case 2: {
        uint64_t len;
        if (!c.Varint(&len, &raw)) return malformed("bad length");
        if (field == static_cast<uint64_t>(payload_field)) {
          pieces.clear();  // The last occurrence wins, as in protobuf.
          if (!c.Take(len, nullptr, &pieces)) return malformed("truncated payload");
        } else {
          head.append(raw);
          if (!c.Take(len, &head, nullptr)) return malformed("truncated field");
        }
        break;
      }
      default:
        return malformed(absl::StrCat("unsupported wire type ", type));
    }
  }
  if (!header->ParseFromString(head)) return malformed("fields do not parse");
  *payload = Payload(std::move(pieces), slices);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<std::string, int>>> DataPlaneChannelArgs(
    absl::string_view overrides) {
  std::vector<std::pair<std::string, int>> args = kDataPlaneArgs();
  for (absl::string_view kv : absl::StrSplit(overrides, ';', absl::SkipEmpty())) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    int v = 0;
    if (p.first.empty() || !absl::SimpleAtoi(p.second, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("grpc arg '", kv, "' is not name=integer"));
    }
    auto it = std::find_if(args.begin(), args.end(), [&](const auto& a) { return a.first == p.first; });
    if (it != args.end()) {
      it->second = v;
    } else {
      args.emplace_back(p.first, v);
    }
  }
  return args;
}

grpc::ByteBuffer SerializeSmall(const google::protobuf::MessageLite& msg) {
  grpc::Slice s(msg.SerializeAsString());
  return grpc::ByteBuffer(&s, 1);
}

absl::Status ParseSmall(const grpc::ByteBuffer& buf, google::protobuf::MessageLite* msg,
                        absl::string_view what) {
  std::vector<grpc::Slice> slices;
  if (!buf.Dump(&slices).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": unreadable message"));
  }
  std::string all;
  for (const auto& s : slices) all.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (!msg->ParseFromString(all)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": malformed message"));
  }
  return absl::OkStatus();
}

namespace {
void ReleasePayloadOwner(void* p) { delete static_cast<std::shared_ptr<const void>*>(p); }
}  // namespace

std::vector<grpc::Slice> PayloadSlices(const Payload& payload) {
  std::vector<grpc::Slice> out;
  for (absl::string_view piece : payload.pieces()) {
    if (piece.empty()) continue;
    out.emplace_back(const_cast<char*>(piece.data()), piece.size(), &ReleasePayloadOwner,
                     new std::shared_ptr<const void>(payload.owner()));
  }
  return out;
}

}  // namespace pscluster
