// Writes a synthetic click-through set in Criteo's format from a planted model (planted_ctr.h):
// train and test files, and planted.txt with the planted model's own AUC and log loss on the
// test split, the ceiling a trained model can reach. The same flags give the same files.
//
//   bazel run //tests/data:gen_ctr_data -- --out_dir=/tmp/ctr --model=fm
//       [--train_examples=2000000 --test_examples=200000 --keys=3000000 --gzip]
//
// The defaults spread the signal over rare values too, more than a few million lines can teach
// any learner; tests/cluster/ctr_training_test.cc uses a set whose signal sits on the values its
// lines teach (--zipf=1.4 --signal_ranks=20 --weight_scale=0.6 --factor_scale=0.15).
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/sharding.h"
#include "tests/data/planted_ctr.h"

ABSL_FLAG(std::string, out_dir, "", "Directory to write train, test and planted.txt into.");
ABSL_FLAG(uint64_t, train_examples, 1000000, "Training examples.");
ABSL_FLAG(uint64_t, test_examples, 100000, "Test examples.");
ABSL_FLAG(std::string, model, "fm", "Planted model: fm (logistic FM) or linear (logistic).");
ABSL_FLAG(uint64_t, seed, 1, "Seeds the planted weights and the examples.");
ABSL_FLAG(uint64_t, keys, 3000000, "Categorical values over all 26 fields.");
ABSL_FLAG(double, zipf, 1.1, "Zipf exponent of each field's values.");
ABSL_FLAG(uint32_t, factor_dim, 4, "FM: width of the planted factors.");
ABSL_FLAG(uint32_t, signal_ranks, 1000, "Weights shrink as 1 / (1 + rank / signal_ranks).");
ABSL_FLAG(double, bias, -1.2, "Planted logit's constant (sets the click rate).");
ABSL_FLAG(double, weight_scale, 0.25, "Std of the planted per-value weights of frequent values.");
ABSL_FLAG(double, factor_scale, 0.17, "FM: std of each entry of a frequent value's factor.");
ABSL_FLAG(double, dense_scale, 0.15, "Std of the planted weights of log(1 + count).");
ABSL_FLAG(bool, gzip, false, "Write train.txt.gz and test.txt.gz instead of plain text.");

namespace pscluster::testdata {
namespace {

// Plain or gzip output, written in large pieces.
class Output {
 public:
  static std::unique_ptr<Output> Open(const std::string& path, bool gzip) {
    auto out = std::unique_ptr<Output>(new Output);
    out->path_ = path;
    if (gzip) {
      out->gz_ = gzopen(path.c_str(), "wb6");
      if (out->gz_ == nullptr) return nullptr;
    } else {
      out->file_ = std::fopen(path.c_str(), "wb");
      if (out->file_ == nullptr) return nullptr;
    }
    return out;
  }
  bool Write(const std::string& data) {
    if (gz_ != nullptr) {
      return data.empty() || gzwrite(gz_, data.data(), static_cast<unsigned>(data.size())) ==
                                 static_cast<int>(data.size());
    }
    return std::fwrite(data.data(), 1, data.size(), file_) == data.size();
  }
  bool Close() {
    bool ok = true;
    if (gz_ != nullptr) ok = gzclose(gz_) == Z_OK;
    if (file_ != nullptr) ok = std::fclose(file_) == 0;
    gz_ = nullptr;
    file_ = nullptr;
    return ok;
  }
  ~Output() { Close(); }

 private:
  Output() = default;
  std::string path_;
  gzFile gz_ = nullptr;
  std::FILE* file_ = nullptr;
};

struct SplitResult {
  uint64_t clicks = 0;
  double log_loss = 0;
  std::vector<std::pair<double, int>> scored;  // Test split only.
};

bool WriteSplit(const PlantedCtrModel& model, uint64_t n, uint64_t stream_seed, bool keep_scores,
                Output* out, SplitResult* result) {
  Rng rng(stream_seed);
  PlantedRow row;
  std::string buf;
  for (uint64_t i = 0; i < n; ++i) {
    model.Draw(rng, &row);
    const double p = 1.0 / (1.0 + std::exp(-model.Logit(row)));
    const int label = rng.Uniform() < p ? 1 : 0;
    result->clicks += label;
    result->log_loss -= std::log(std::max(1e-15, label == 1 ? p : 1.0 - p));
    if (keep_scores) result->scored.emplace_back(p, label);
    model.AppendLine(row, label, &buf);
    if (buf.size() >= (4 << 20)) {
      if (!out->Write(buf)) return false;
      buf.clear();
    }
  }
  return out->Write(buf) && out->Close();
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_out_dir);
  if (dir.empty()) {
    std::fprintf(stderr, "--out_dir is required\n");
    return 2;
  }
  PlantedOptions o;
  const std::string kind = absl::GetFlag(FLAGS_model);
  if (kind != "fm" && kind != "linear") {
    std::fprintf(stderr, "--model: '%s' is not fm or linear\n", kind.c_str());
    return 2;
  }
  o.kind = kind == "fm" ? PlantedKind::kFm : PlantedKind::kLinear;
  o.seed = absl::GetFlag(FLAGS_seed);
  o.total_keys = absl::GetFlag(FLAGS_keys);
  o.zipf_exponent = absl::GetFlag(FLAGS_zipf);
  o.factor_dim = absl::GetFlag(FLAGS_factor_dim);
  o.signal_ranks = absl::GetFlag(FLAGS_signal_ranks);
  o.bias = absl::GetFlag(FLAGS_bias);
  o.weight_scale = absl::GetFlag(FLAGS_weight_scale);
  o.factor_scale = absl::GetFlag(FLAGS_factor_scale);
  o.dense_scale = absl::GetFlag(FLAGS_dense_scale);
  if (o.zipf_exponent <= 0 || o.total_keys < 2 * kFields || o.signal_ranks == 0 ||
      o.factor_dim == 0 || o.factor_dim > 256) {
    std::fprintf(stderr,
                 "--zipf must be > 0, --keys >= 52, --signal_ranks >= 1, "
                 "--factor_dim in [1, 256]\n");
    return 2;
  }
  for (auto [name, v] : {std::make_pair("bias", o.bias), std::make_pair("weight_scale", o.weight_scale),
                         std::make_pair("factor_scale", o.factor_scale),
                         std::make_pair("dense_scale", o.dense_scale)}) {
    if (!std::isfinite(v) || std::fabs(v) > 100 || (v < 0 && std::string(name) != "bias")) {
      std::fprintf(stderr, "--%s: %g is not a finite number in [0, 100] ([-100, 100] for bias)\n",
                   name, v);
      return 2;
    }
  }
  const PlantedCtrModel model(o);
  const bool gz = absl::GetFlag(FLAGS_gzip);
  const char* ext = gz ? ".txt.gz" : ".txt";
  SplitResult train, test;
  for (auto [name, n, seed, result] :
       {std::make_tuple("train", absl::GetFlag(FLAGS_train_examples), Mix64(o.seed ^ 1), &train),
        std::make_tuple("test", absl::GetFlag(FLAGS_test_examples), Mix64(o.seed ^ 2), &test)}) {
    const std::string path = absl::StrCat(dir, "/", name, ext);
    auto out = Output::Open(path, gz);
    if (out == nullptr || !WriteSplit(model, n, seed, result == &test, out.get(), result)) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
  }
  const uint64_t n_train = absl::GetFlag(FLAGS_train_examples);
  const uint64_t n_test = absl::GetFlag(FLAGS_test_examples);
  std::string summary = absl::StrFormat(
      "model: %s\nseed: %d\nkeys: %d\nzipf: %g\nfactor_dim: %d\nsignal_ranks: %d\n"
      "bias: %g\nweight_scale: %g\nfactor_scale: %g\ndense_scale: %g\n"
      "train_examples: %d\ntest_examples: %d\ntrain_click_rate: %.4f\ntest_click_rate: %.4f\n"
      "planted_test_auc: %.4f\nplanted_test_logloss: %.4f\n",
      kind, o.seed, model.total_keys(), o.zipf_exponent, o.factor_dim, o.signal_ranks, o.bias,
      o.weight_scale, o.factor_scale, o.dense_scale, n_train,
      n_test, n_train > 0 ? double(train.clicks) / n_train : 0.0,
      n_test > 0 ? double(test.clicks) / n_test : 0.0, ExactAuc(std::move(test.scored)),
      n_test > 0 ? test.log_loss / n_test : 0.0);
  auto info = Output::Open(dir + "/planted.txt", false);
  if (info == nullptr || !info->Write(summary) || !info->Close()) {
    std::fprintf(stderr, "cannot write %s/planted.txt\n", dir.c_str());
    return 1;
  }
  std::fputs(summary.c_str(), stdout);
  return 0;
}

}  // namespace
}  // namespace pscluster::testdata

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pscluster::testdata::Main();
}
