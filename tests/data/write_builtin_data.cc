// Writes a built-in data set as files in a standard format, for the example jobs that train
// through the streaming readers (deploy/examples/libsvm_linear.yaml, fashion_csv_mlp.yaml):
//
//   bazel run //tests/data:write_builtin_data -- --dataset=spam_assassin
//       --out_dir=/tmp/pscluster/data/spam        (train.libsvm, test.libsvm)
//   bazel run //tests/data:write_builtin_data -- --dataset=fashion_mnist
//       --out_dir=/tmp/pscluster/data/fashion     (train.csv, test.csv)
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "tests/data/builtin_files.h"

ABSL_FLAG(std::string, dataset, "spam_assassin", "spam_assassin (LibSVM) or fashion_mnist (CSV).");
ABSL_FLAG(std::string, out_dir, "", "Directory to write train.* and test.* into (created).");
ABSL_FLAG(unsigned, hash_bits, 20, "spam_assassin: words hashed into 2^hash_bits features.");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string out = absl::GetFlag(FLAGS_out_dir);
  if (out.empty()) {
    std::fprintf(stderr, "--out_dir is required\n");
    return 2;
  }
  const std::string name = absl::GetFlag(FLAGS_dataset);
  if (name != "spam_assassin" && name != "fashion_mnist") {
    std::fprintf(stderr, "--dataset: '%s' is not spam_assassin or fashion_mnist\n", name.c_str());
    return 2;
  }
  absl::Status s = pscluster::testdata::WriteBuiltin(name, out, absl::GetFlag(FLAGS_hash_bits));
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("%s written to %s\n", name.c_str(), out.c_str());
  return 0;
}
