// The built-in data sets (as a worker loads them) written out in the standard formats the
// streaming readers take: SpamAssassin as LibSVM, Fashion-MNIST as CSV. Tests and the example
// jobs use them to train the same data through the user's-files path.
#ifndef PSCLUSTER_TESTS_DATA_BUILTIN_FILES_H_
#define PSCLUSTER_TESTS_DATA_BUILTIN_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "worker/data/dataset.h"

namespace pscluster::testdata {

// One line per example: "label key:value ...", keys 0-based (index_base: 0), label the class.
absl::Status WriteLibsvm(const data::SparseDataset& d, const std::string& path);

// A header "label,f0,f1,..." then one line per example: the class, then the features (printed
// with up to 4 significant digits, 0 as "0").
absl::Status WriteCsv(const data::DenseDataset& d, const std::string& path);

// Loads the built-in set `name` (spam_assassin: hashed into 2^hash_bits keys, 20% held out;
// fashion_mnist) from the default directories and writes its train and test splits into
// `out_dir` (created): train.libsvm and test.libsvm, or train.csv and test.csv.
absl::Status WriteBuiltin(const std::string& name, const std::string& out_dir,
                          unsigned hash_bits = 20);

}  // namespace pscluster::testdata

#endif  // PSCLUSTER_TESTS_DATA_BUILTIN_FILES_H_
