#include "common/safetensors.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/dtype.h"

namespace pscluster {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100 << 20;  // The reference implementation's limit.
constexpr int kMaxJsonDepth = 16;

struct DTypeNameEntry {
  v1::DataType dtype;
  absl::string_view name;
};
constexpr DTypeNameEntry kDTypeNames[] = {
    {v1::DT_FLOAT32, "F32"}, {v1::DT_FLOAT16, "F16"}, {v1::DT_BFLOAT16, "BF16"},
    {v1::DT_FLOAT64, "F64"}, {v1::DT_INT32, "I32"},   {v1::DT_INT64, "I64"},
    {v1::DT_UINT64, "U64"},
};

v1::DataType DTypeFromName(absl::string_view name) {
  for (const auto& e : kDTypeNames) {
    if (e.name == name) return e.dtype;
  }
  return v1::DT_INVALID;
}

void AppendJsonString(std::string* out, absl::string_view s) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default:
        if (c < 0x20) {
          char buf[8];
          snprintf(buf, sizeof(buf), "\\u%04x", c);
          out->append(buf);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

// A small JSON value tree: enough for safetensors headers (objects, arrays, strings, integers).
struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  std::string text;  // kString: the decoded string; kNumber: the literal.
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;
};

class JsonParser {
 public:
  explicit JsonParser(absl::string_view in) : in_(in) {}

  absl::StatusOr<Json> ParseDocument() {
    Json v;
    absl::Status s = ParseValue(&v, 0);
    if (!s.ok()) return s;
    SkipSpace();
    if (pos_ != in_.size()) return Error("trailing characters after the JSON object");
    return v;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("header JSON at byte ", pos_, ": ", what));
  }
  void SkipSpace() {
    while (pos_ < in_.size() &&
           (in_[pos_] == ' ' || in_[pos_] == '\n' || in_[pos_] == '\r' || in_[pos_] == '\t')) {
      ++pos_;
    }
  }
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < in_.size() && in_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  absl::Status ParseValue(Json* out, int depth) {
    if (depth > kMaxJsonDepth) return Error("nesting too deep");
    SkipSpace();
    if (pos_ >= in_.size()) return Error("unexpected end");
    char c = in_[pos_];
    if (c == '{') return ParseObject(out, depth);
    if (c == '[') return ParseArray(out, depth);
    if (c == '"') {
      out->kind = Json::kString;
      return ParseString(&out->text);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      size_t start = pos_;
      ++pos_;
      while (pos_ < in_.size() && (std::isdigit(static_cast<unsigned char>(in_[pos_])) ||
                                   in_[pos_] == '.' || in_[pos_] == 'e' || in_[pos_] == 'E' ||
                                   in_[pos_] == '+' || in_[pos_] == '-')) {
        ++pos_;
      }
      out->kind = Json::kNumber;
      out->text = std::string(in_.substr(start, pos_ - start));
      return absl::OkStatus();
    }
    for (absl::string_view word : {"true", "false", "null"}) {
      if (in_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        out->kind = word == "null" ? Json::kNull : Json::kBool;
        out->text = std::string(word);
        return absl::OkStatus();
      }
    }
    return Error("unexpected character");
  }

  absl::Status ParseObject(Json* out, int depth) {
    out->kind = Json::kObject;
    ++pos_;  // '{'
    if (Consume('}')) return absl::OkStatus();
    while (true) {
      SkipSpace();
      std::string key;
      if (pos_ >= in_.size() || in_[pos_] != '"') return Error("expected a quoted key");
      absl::Status s = ParseString(&key);
      if (!s.ok()) return s;
      if (!Consume(':')) return Error("expected ':'");
      Json value;
      s = ParseValue(&value, depth + 1);
      if (!s.ok()) return s;
      for (const auto& m : out->members) {
        if (m.first == key) return Error(absl::StrCat("duplicate key \"", key, "\""));
      }
      out->members.emplace_back(std::move(key), std::move(value));
      if (Consume(',')) continue;
      if (Consume('}')) return absl::OkStatus();
      return Error("expected ',' or '}'");
    }
  }

  absl::Status ParseArray(Json* out, int depth) {
    out->kind = Json::kArray;
    ++pos_;  // '['
    if (Consume(']')) return absl::OkStatus();
    while (true) {
      Json value;
      absl::Status s = ParseValue(&value, depth + 1);
      if (!s.ok()) return s;
      out->items.push_back(std::move(value));
      if (Consume(',')) continue;
      if (Consume(']')) return absl::OkStatus();
      return Error("expected ',' or ']'");
    }
  }

  static void AppendUtf8(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }

  absl::Status ParseHex4(uint32_t* out) {
    if (pos_ + 4 > in_.size()) return Error("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char h = in_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= h - '0';
      else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
      else return Error("bad \\u escape");
    }
    *out = v;
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string* out) {
    ++pos_;  // '"'
    while (pos_ < in_.size()) {
      char c = in_[pos_++];
      if (c == '"') return absl::OkStatus();
      if (static_cast<unsigned char>(c) < 0x20) return Error("control character in a string");
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= in_.size()) break;
      char e = in_[pos_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp = 0;
          absl::Status s = ParseHex4(&cp);
          if (!s.ok()) return s;
          if (cp >= 0xd800 && cp < 0xdc00) {
            uint32_t lo = 0;
            if (in_.substr(pos_, 2) != "\\u") return Error("unpaired surrogate");
            pos_ += 2;
            s = ParseHex4(&lo);
            if (!s.ok()) return s;
            if (lo < 0xdc00 || lo >= 0xe000) return Error("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          }
          AppendUtf8(out, cp);
          break;
        }
        default:
          return Error("bad escape");
      }
    }
    return Error("unterminated string");
  }

  absl::string_view in_;
  size_t pos_ = 0;
};

bool ParseUint(const Json& j, uint64_t* out) {
  if (j.kind != Json::kNumber || j.text.empty() || j.text.size() > 20) return false;
  uint64_t v = 0;
  for (char c : j.text) {
    if (c < '0' || c > '9') return false;
    uint64_t next = v * 10 + static_cast<uint64_t>(c - '0');
    if (next / 10 != v) return false;  // Overflow.
    v = next;
  }
  *out = v;
  return true;
}

// product(shape) * elem_size, or false on overflow.
bool ByteSize(const std::vector<uint64_t>& shape, size_t elem_size, uint64_t* out) {
  unsigned __int128 n = elem_size;
  for (uint64_t d : shape) {
    n *= d;
    if (n > (static_cast<unsigned __int128>(1) << 62)) return false;
  }
  *out = static_cast<uint64_t>(n);
  return true;
}

}  // namespace

absl::string_view SafetensorsDTypeName(v1::DataType dtype) {
  for (const auto& e : kDTypeNames) {
    if (e.dtype == dtype) return e.name;
  }
  return "";
}

namespace {

// The 8-byte length and the JSON header of `entries` (in that order in the data section), padded
// so that the data starts 8-byte aligned; *data_bytes: the data section's size.
absl::StatusOr<std::string> EncodeHeader(const std::vector<SafetensorsWriter::Entry>& entries,
                                         const std::map<std::string, std::string>& metadata,
                                         uint64_t* data_bytes) {
  std::string header = "{";
  std::set<std::string> names;
  uint64_t offset = 0;
  bool first = true;
  if (!metadata.empty()) {
    header.append("\"__metadata__\":{");
    bool first_meta = true;
    for (const auto& [k, v] : metadata) {
      if (!first_meta) header.push_back(',');
      first_meta = false;
      AppendJsonString(&header, k);
      header.push_back(':');
      AppendJsonString(&header, v);
    }
    header.push_back('}');
    first = false;
  }
  for (const auto& t : entries) {
    if (t.name.empty() || t.name == "__metadata__") {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: bad tensor name '", t.name, "'"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: duplicate tensor name '", t.name, "'"));
    }
    absl::string_view dt = SafetensorsDTypeName(t.dtype);
    if (dt.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", t.name,
                                                     "' has an unsupported dtype"));
    }
    uint64_t bytes = 0;
    if (!ByteSize(t.shape, DTypeSize(t.dtype), &bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor '", t.name, "' has a shape too large to store"));
    }
    if (!first) header.push_back(',');
    first = false;
    AppendJsonString(&header, t.name);
    absl::StrAppend(&header, ":{\"dtype\":\"", dt, "\",\"shape\":[");
    for (size_t i = 0; i < t.shape.size(); ++i) {
      absl::StrAppend(&header, i ? "," : "", t.shape[i]);
    }
    absl::StrAppend(&header, "],\"data_offsets\":[", offset, ",", offset + bytes, "]}");
    offset += bytes;
  }
  header.push_back('}');
  // Pad with spaces so the data section starts 8-byte aligned (as the reference writer does).
  while ((header.size() % 8) != 0) header.push_back(' ');
  std::string out;
  out.reserve(8 + header.size());
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(header);
  *data_bytes = offset;
  return out;
}

}  // namespace

absl::StatusOr<std::string> EncodeSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                              const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Entry> entries;
  entries.reserve(tensors.size());
  for (const auto& t : tensors) {
    uint64_t bytes = 0;
    if (ByteSize(t.shape, DTypeSize(t.dtype), &bytes) && bytes != t.data.size() &&
        !SafetensorsDTypeName(t.dtype).empty()) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", t.name, "' has ",
                                                     t.data.size(), " bytes, its shape needs ",
                                                     bytes));
    }
    entries.push_back({t.name, t.dtype, t.shape});
  }
  uint64_t data_bytes = 0;
  auto out = EncodeHeader(entries, metadata, &data_bytes);
  if (!out.ok()) return out.status();
  out->reserve(out->size() + data_bytes);
  for (const auto& t : tensors) out->append(t.data.data(), t.data.size());
  return out;
}

absl::StatusOr<uint64_t> WriteSafetensors(const std::string& path,
                                          const std::vector<SafetensorsTensor>& tensors,
                                          const std::map<std::string, std::string>& metadata,
                                          FileSystem* fs) {
  auto bytes = EncodeSafetensors(tensors, metadata);
  if (!bytes.ok()) return bytes.status();
  absl::Status s = WriteFileAtomically(fs, path, *bytes);
  if (!s.ok()) return s;
  return static_cast<uint64_t>(bytes->size());
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, const std::vector<Entry>& entries,
    const std::map<std::string, std::string>& metadata, FileSystem* fs) {
  uint64_t data_bytes = 0;
  auto header = EncodeHeader(entries, metadata, &data_bytes);
  if (!header.ok()) return header.status();
  auto file = AtomicFileWriter::Create(fs, path);
  if (!file.ok()) return file.status();
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  w->path_ = path;
  w->file_ = std::move(*file);
  w->remaining_ = data_bytes;
  w->written_ = header->size();
  absl::Status s = w->file_->Append(*header);
  if (!s.ok()) return s;
  return w;
}

absl::Status SafetensorsWriter::Append(absl::string_view bytes) {
  if (bytes.size() > remaining_) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", bytes.size(),
                                                   " bytes appended where the tensors declared ",
                                                   remaining_, " more"));
  }
  absl::Status s = file_->Append(bytes);
  if (!s.ok()) return s;
  remaining_ -= bytes.size();
  written_ += bytes.size();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SafetensorsWriter::Finish() {
  if (remaining_ != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": ", remaining_, " bytes of the declared tensors were never appended"));
  }
  absl::Status s = file_->Commit();
  if (!s.ok()) return s;
  return written_;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::string bytes, absl::string_view source) {
  auto fail = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a valid safetensors file: ", what));
  };
  if (bytes.size() < 8) return fail(absl::StrCat("only ", bytes.size(), " bytes, no header length"));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  if (n > kMaxHeaderBytes || n > bytes.size() - 8) {
    return fail(absl::StrCat("header length ", n, " exceeds the file (", bytes.size(), " bytes)"));
  }
  auto json = JsonParser(absl::string_view(bytes).substr(8, n)).ParseDocument();
  if (!json.ok()) return fail(json.status().message());
  if (json->kind != Json::kObject) return fail("header is not a JSON object");
  SafetensorsFile out;
  out.data_start_ = 8 + n;
  const uint64_t data_size = bytes.size() - out.data_start_;
  for (auto& [name, value] : json->members) {
    if (name == "__metadata__") {
      if (value.kind != Json::kObject) return fail("__metadata__ is not an object");
      for (auto& [k, v] : value.members) {
        if (v.kind != Json::kString) return fail(absl::StrCat("__metadata__.", k, " is not a string"));
        out.metadata_[k] = v.text;
      }
      continue;
    }
    auto tfail = [&](absl::string_view what) {
      return fail(absl::StrCat("tensor '", name, "': ", what));
    };
    if (value.kind != Json::kObject) return tfail("entry is not an object");
    Entry e;
    e.name = name;
    bool have_dtype = false, have_shape = false, have_offsets = false;
    for (auto& [k, v] : value.members) {
      if (k == "dtype") {
        if (v.kind != Json::kString) return tfail("dtype is not a string");
        e.dtype = DTypeFromName(v.text);
        if (e.dtype == v1::DT_INVALID) return tfail(absl::StrCat("unsupported dtype '", v.text, "'"));
        have_dtype = true;
      } else if (k == "shape") {
        if (v.kind != Json::kArray) return tfail("shape is not an array");
        for (const Json& d : v.items) {
          uint64_t dim;
          if (!ParseUint(d, &dim)) return tfail("shape has a non-integer dimension");
          e.shape.push_back(dim);
        }
        have_shape = true;
      } else if (k == "data_offsets") {
        if (v.kind != Json::kArray || v.items.size() != 2 || !ParseUint(v.items[0], &e.begin) ||
            !ParseUint(v.items[1], &e.end)) {
          return tfail("data_offsets is not [begin, end]");
        }
        have_offsets = true;
      } else {
        return tfail(absl::StrCat("unknown field '", k, "'"));
      }
    }
    if (!have_dtype || !have_shape || !have_offsets) {
      return tfail("needs dtype, shape and data_offsets");
    }
    if (e.begin > e.end || e.end > data_size) {
      return tfail(absl::StrCat("data_offsets [", e.begin, ", ", e.end,
                                "] outside the data section of ", data_size, " bytes"));
    }
    uint64_t need = 0;
    if (!ByteSize(e.shape, DTypeSize(e.dtype), &need)) return tfail("shape is too large");
    if (need != e.end - e.begin) {
      return tfail(absl::StrCat("data_offsets span ", e.end - e.begin,
                                " bytes but dtype and shape need ", need));
    }
    out.entries_.push_back(std::move(e));
  }
  std::sort(out.entries_.begin(), out.entries_.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); });
  uint64_t expect = 0;
  for (const Entry& e : out.entries_) {
    if (e.begin != expect) {
      return fail(absl::StrCat("tensor '", e.name, "' starts at ", e.begin, ", expected ", expect,
                               " (tensors overlap or leave a gap)"));
    }
    expect = e.end;
  }
  if (expect != data_size) {
    return fail(absl::StrCat("tensors cover ", expect, " bytes of a ", data_size,
                             "-byte data section"));
  }
  out.bytes_ = std::move(bytes);
  return out;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  auto bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  return Parse(std::move(*bytes), path);
}

const SafetensorsFile::Entry* SafetensorsFile::Find(absl::string_view name) const {
  for (const Entry& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

}  // namespace pscluster
