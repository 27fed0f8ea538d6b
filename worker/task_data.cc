#include "worker/task_data.h"

#include "absl/strings/str_cat.h"
#include "worker/data/fashion_mnist.h"
#include "worker/data/spam_assassin.h"

namespace pscluster::worker {

std::unique_ptr<Batcher> TaskData::TrainBatcher() const {
  return sparse ? std::make_unique<Batcher>(&sparse_train) : std::make_unique<Batcher>(&dense_train);
}

std::unique_ptr<Batcher> TaskData::TestBatcher() const {
  return sparse ? std::make_unique<Batcher>(&sparse_test) : std::make_unique<Batcher>(&dense_test);
}

absl::StatusOr<std::unique_ptr<TaskData>> LoadTaskData(const v1::JobSpec& spec,
                                                       const DataDirs& dirs) {
  auto out = std::make_unique<TaskData>();
  const v1::DatasetSpec& ds = spec.dataset();
  if (ds.name() == "fashion_mnist") {
    std::string dir = ds.path().empty() ? dirs.fashion_mnist : ds.path();
    auto fm = data::LoadFashionMnist(dir);
    if (!fm.ok()) {
      return absl::Status(fm.status().code(), absl::StrCat("dataset: ", fm.status().message()));
    }
    out->dense_train = std::move(fm->train);
    out->dense_test = std::move(fm->test);
    out->description = absl::StrCat("fashion_mnist (", out->dense_train.n, " train, ",
                                    out->dense_test.n, " test) from ",
                                    dir.empty() ? data::kFashionMnistDefaultDir : dir);
    return out;
  }
  if (ds.name() == "spam_assassin") {
    data::SpamAssassinOptions opts;
    opts.dir = ds.path().empty() ? dirs.spam_assassin : ds.path();
    if (ds.hash_bits() > 0) opts.hash_bits = static_cast<int>(ds.hash_bits());
    if (ds.holdout_fraction() > 0) opts.holdout_fraction = ds.holdout_fraction();
    auto sa = data::LoadSpamAssassin(opts);
    if (!sa.ok()) {
      return absl::Status(sa.status().code(), absl::StrCat("dataset: ", sa.status().message()));
    }
    out->sparse = true;
    out->sparse_train = std::move(sa->train);
    out->sparse_test = std::move(sa->test);
    out->description = absl::StrCat(
        "spam_assassin (", out->sparse_train.n, " train, ", out->sparse_test.n, " held out, 2^",
        opts.hash_bits, " hashed features) from ",
        opts.dir.empty() ? data::kSpamAssassinDefaultDir : opts.dir);
    return out;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "dataset.name: '", ds.name(), "' is not a data set a worker can train on "
      "(fashion_mnist or spam_assassin)"));
}

v1::ModelSpec CompleteModelSpec(const v1::ModelSpec& model, const TaskData& data,
                                const v1::DatasetSpec& dataset) {
  v1::ModelSpec m = model;
  if (m.num_classes() == 0) {
    m.set_num_classes(data.sparse ? data.sparse_train.num_classes : data.dense_train.num_classes);
  }
  if (m.input_dim() == 0) {
    m.set_input_dim(data.sparse ? static_cast<uint32_t>(data.sparse_train.key_space)
                                : static_cast<uint32_t>(data.dense_train.dim));
  }
  (void)dataset;
  return m;
}

}  // namespace pscluster::worker
