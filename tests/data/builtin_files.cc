#include "tests/data/builtin_files.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/job.pb.h"
#include "worker/task_data.h"

namespace pscluster::testdata {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

absl::Status Written(std::unique_ptr<std::FILE, FileCloser> f, const std::string& path) {
  const bool ok = std::ferror(f.get()) == 0;
  if (std::fclose(f.release()) != 0 || !ok) {
    return absl::InternalError(absl::StrCat(path, ": write failed: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<std::FILE, FileCloser>> Create(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "w"));
  if (f == nullptr) {
    return absl::InternalError(absl::StrCat(path, ": cannot create: ", std::strerror(errno)));
  }
  return f;
}

}  // namespace

absl::Status WriteLibsvm(const data::SparseDataset& d, const std::string& path) {
  auto f = Create(path);
  if (!f.ok()) return f.status();
  std::string line;
  for (int64_t i = 0; i < d.n; ++i) {
    line = absl::StrCat(d.y[i]);
    for (uint64_t j = d.offsets[i]; j < d.offsets[i + 1]; ++j) {
      absl::StrAppend(&line, " ", d.keys[j], ":", absl::StrFormat("%.6g", d.values[j]));
    }
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), f->get());
  }
  return Written(std::move(*f), path);
}

absl::Status WriteCsv(const data::DenseDataset& d, const std::string& path) {
  auto f = Create(path);
  if (!f.ok()) return f.status();
  std::string line = "label";
  for (int64_t k = 0; k < d.dim; ++k) absl::StrAppend(&line, ",f", k);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), f->get());
  for (int64_t i = 0; i < d.n; ++i) {
    line = absl::StrCat(d.y[i]);
    const float* x = d.x.data() + i * d.dim;
    for (int64_t k = 0; k < d.dim; ++k) {
      if (x[k] == 0.0f) {
        line += ",0";
      } else {
        absl::StrAppend(&line, ",", absl::StrFormat("%.4g", x[k]));
      }
    }
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), f->get());
  }
  return Written(std::move(*f), path);
}

absl::Status WriteBuiltin(const std::string& name, const std::string& out_dir,
                          unsigned hash_bits) {
  v1::JobSpec spec;
  spec.mutable_dataset()->set_name(name);
  if (name == "spam_assassin") {
    spec.mutable_dataset()->set_hash_bits(hash_bits);
    spec.mutable_dataset()->set_holdout_fraction(0.2);
  }
  spec.set_seed(7);
  auto data = worker::LoadTaskData(spec, worker::DataDirs());
  if (!data.ok()) return data.status();
  if (::mkdir(out_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat(out_dir, ": cannot create: ", std::strerror(errno)));
  }
  if ((*data)->sparse) {
    absl::Status s = WriteLibsvm((*data)->sparse_train, out_dir + "/train.libsvm");
    if (!s.ok()) return s;
    return WriteLibsvm((*data)->sparse_test, out_dir + "/test.libsvm");
  }
  absl::Status s = WriteCsv((*data)->dense_train, out_dir + "/train.csv");
  if (!s.ok()) return s;
  return WriteCsv((*data)->dense_test, out_dir + "/test.csv");
}

}  // namespace pscluster::testdata
