#include "worker/data/test_files.h"

#include <random>

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pscluster::data::testing {
namespace {

class FaultyFile final : public RandomAccessFile {
 public:
  FaultyFile(std::unique_ptr<RandomAccessFile> base, uint64_t fail_at, absl::Status error)
      : base_(std::move(base)), fail_at_(fail_at), error_(std::move(error)) {}
  absl::StatusOr<size_t> Read(uint64_t offset, size_t n, char* buf) override {
    if (offset + n > fail_at_) return error_;
    return base_->Read(offset, n, buf);
  }

 private:
  std::unique_ptr<RandomAccessFile> base_;
  const uint64_t fail_at_;
  const absl::Status error_;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "test_files: %s\n", what.c_str());
  std::abort();
}

}  // namespace

std::string NewTempDir(const std::string& name) {
  static std::atomic<int> counter{0};
  const char* root = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(root != nullptr ? root : "/tmp", "/", name, "_", ::getpid(), "_",
                                 counter.fetch_add(1));
  if (::mkdir(dir.c_str(), 0755) != 0) Die(absl::StrCat("cannot create ", dir));
  return dir;
}

void WriteText(const std::string& path, absl::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) Die(absl::StrCat("cannot write ", path));
}

void WriteGzip(const std::string& path, absl::string_view text, int members) {
  std::remove(path.c_str());
  const size_t n = text.size();
  for (int m = 0; m < members; ++m) {
    const size_t b = n * m / members, e = n * (m + 1) / members;
    gzFile f = gzopen(path.c_str(), "ab");
    if (f == nullptr) Die(absl::StrCat("cannot write ", path));
    if (e > b && gzwrite(f, text.data() + b, static_cast<unsigned>(e - b)) == 0) {
      Die(absl::StrCat("cannot compress into ", path));
    }
    if (gzclose(f) != Z_OK) Die(absl::StrCat("cannot close ", path));
  }
}

std::string PlantedCriteoLines(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> value(0, 9), dense(0, 20);
  std::string text;
  for (int i = 0; i < n; ++i) {
    // I1 is small (0-2) or large (50-90): apart after log1p.
    const int c2 = value(rng), i1 = value(rng) < 2 ? 50 + 4 * value(rng) : value(rng) % 3;
    const int label = (c2 < 3 || i1 >= 50) ? 1 : 0;
    absl::StrAppend(&text, label, "\t", i1);
    for (int d = 1; d < 13; ++d) absl::StrAppend(&text, "\t", dense(rng));
    for (int f = 0; f < 26; ++f) {
      absl::StrAppend(&text, "\t", absl::StrFormat("%08x", f == 1 ? c2 : value(rng)));
    }
    absl::StrAppend(&text, "\n");
  }
  return text;
}

std::vector<std::string> SplitLines(absl::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    size_t stop = nl == absl::string_view::npos ? text.size() : nl;
    absl::string_view line = text.substr(start, stop - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    out.emplace_back(line);
    start = stop + 1;
  }
  return out;
}

std::string Signature(const Example& e) {
  std::string s = absl::StrCat(e.label, "|");
  for (float d : e.dense) absl::StrAppend(&s, absl::StrFormat("%g", d), ",");
  absl::StrAppend(&s, "|");
  for (size_t i = 0; i < e.keys.size(); ++i) {
    absl::StrAppend(&s, e.keys[i], ":", absl::StrFormat("%g", e.values[i]), ",");
  }
  return s;
}

std::vector<std::string> Signatures(const ExampleBatch& batch) {
  std::vector<std::string> out;
  for (size_t i = 0; i < batch.size(); ++i) {
    Example e;
    e.label = batch.labels[i];
    e.dense.assign(batch.dense.begin() + i * batch.dense_dim,
                   batch.dense.begin() + (i + 1) * batch.dense_dim);
    e.keys.assign(batch.keys.begin() + batch.offsets[i], batch.keys.begin() + batch.offsets[i + 1]);
    e.values.assign(batch.values.begin() + batch.offsets[i],
                    batch.values.begin() + batch.offsets[i + 1]);
    out.push_back(Signature(e));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ReadAll(StreamReader* reader, size_t batch) {
  std::vector<std::string> out;
  ExampleBatch b;
  while (true) {
    auto n = reader->Next(batch, &b);
    if (!n.ok()) return n.status();
    if (*n == 0) return out;
    std::vector<std::string> s = Signatures(b);
    out.insert(out.end(), s.begin(), s.end());
  }
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> FaultyFileSystem::Open(const std::string& path) {
  auto f = base_->Open(path);
  if (!f.ok() || path != path_) return f;
  return std::unique_ptr<RandomAccessFile>(new FaultyFile(std::move(*f), fail_at_, error_));
}

}  // namespace pscluster::data::testing
