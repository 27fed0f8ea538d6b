// A layer graph on the user's files, as a worker runs it: the model spec completed from the
// data's schema (dense features, categorical fields, key space), batches streamed from Criteo
// lines, and a few hundred steps that learn what the lines plant.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/create_backend.h"
#include "kernels/models/create_model.h"
#include "kernels/models/host_init.h"
#include "kernels/models/model_test_util.h"
#include "worker/auc.h"
#include "worker/data/test_files.h"
#include "worker/streamed_data.h"

namespace pscluster::worker {
namespace {

TEST(GraphDataTest, AWideAndDeepGraphTrainsOnCriteoFiles) {
  const std::string dir = data::testing::NewTempDir("graph");
  data::testing::WriteText(dir + "/train.tsv", data::testing::PlantedCriteoLines(4000, 1));
  data::testing::WriteText(dir + "/test.tsv", data::testing::PlantedCriteoLines(500, 2));
  v1::JobSpec spec;
  spec.set_seed(5);
  v1::ModelSpec* m = spec.mutable_model();
  m->set_kind("graph");
  kernels::testing::AddLayer(m, "dense", "dense_input");
  kernels::testing::AddLayer(m, "cat", "categorical_input");
  kernels::testing::AddLayer(m, "wide", "linear", {"cat"});
  kernels::testing::AddLayer(m, "emb", "embedding", {"cat"})->set_width(4);
  kernels::testing::AddLayer(m, "deep_in", "concat", {"dense", "emb"});
  v1::LayerSpec* deep = kernels::testing::AddLayer(m, "deep", "mlp", {"deep_in"});
  deep->add_widths(16);
  deep->add_widths(1);
  kernels::testing::AddLayer(m, "logit", "add", {"wide", "deep"});
  kernels::testing::AddLayer(m, "head", "sigmoid", {"logit"});
  v1::DatasetSpec* d = spec.mutable_dataset();
  d->set_format("criteo");
  d->set_train(dir + "/train.tsv");
  d->set_test(dir + "/test.tsv");
  d->set_hash_buckets(1000);
  d->set_dense_transform("log1p");

  auto data = OpenStreamedData(spec);
  ASSERT_TRUE(data.ok()) << data.status();
  const v1::ModelSpec model_spec = CompleteStreamedModelSpec(spec.model(), (*data)->dataset->schema());
  EXPECT_EQ(model_spec.input_dim(), 13u);
  ASSERT_EQ(model_spec.input_fields_size(), 26);
  EXPECT_EQ(model_spec.input_fields(1).name(), "C2");
  EXPECT_EQ(model_spec.key_space(), 26u * 1000u);

  auto backend = kernels::CreateBackend("cpu", kernels::BackendOptions());
  ASSERT_TRUE(backend.ok());
  auto model = kernels::CreateModel(model_spec, backend->get());
  ASSERT_TRUE(model.ok()) << model.status();
  // One table per field, plus the wide part's and the mlp's.
  int emb_c1 = -1;
  for (size_t i = 0; i < (*model)->params().size(); ++i) {
    if ((*model)->params()[i].name == "emb/C1") emb_c1 = static_cast<int>(i);
  }
  ASSERT_GE(emb_c1, 0);
  EXPECT_EQ((*model)->params()[emb_c1].key_space, 1000u);  // Keys rebased to the field.

  data::PartitionSpec part;
  const int64_t batch = 50, steps = 80;
  auto train = StreamedTrainSource::Create(data->get(), part, batch, steps);
  ASSERT_TRUE(train.ok()) << train.status();
  kernels::HostParams host(**model);
  for (int64_t step = 0; step < 5 * steps; ++step) {
    auto b = (*train)->BatchFor(step);
    ASSERT_TRUE(b.ok()) << b.status();
    auto keys = (*model)->SparseKeys(*b);
    ASSERT_TRUE(keys.ok()) << keys.status();
    auto values = host.Gather(*keys);
    ASSERT_TRUE(values.ok());
    kernels::Gradients grads = host.GradientBuffers();
    kernels::StepResult r;
    ASSERT_TRUE((*model)->TrainStep(*b, *values, grads, &r).ok());
    host.ApplySgd(grads, 0.5f);
  }
  StreamedTestSource test(data->get());
  ASSERT_TRUE(test.Start().ok());
  int64_t correct = 0, seen = 0;
  AucAccumulator auc;
  for (;;) {
    auto b = test.Next(100);
    ASSERT_TRUE(b.ok()) << b.status();
    if (b->num_examples == 0) break;
    auto values = host.Gather(*(*model)->SparseKeys(*b));
    ASSERT_TRUE(values.ok());
    kernels::StepResult r;
    std::vector<float> scores;
    ASSERT_TRUE((*model)->EvaluateScores(*b, *values, &r, &scores).ok());
    ASSERT_EQ(scores.size(), static_cast<size_t>(b->num_examples));
    int64_t right = 0;  // The scores are the logits: positive predicts class 1.
    for (int64_t i = 0; i < b->num_examples; ++i) {
      right += (scores[i] > 0) == (b->labels[i] == 1) ? 1 : 0;
      auc.Add(scores[i], b->labels[i]);
    }
    EXPECT_EQ(right, r.correct);
    correct += r.correct;
    seen += r.examples;
  }
  EXPECT_EQ(seen, 500);
  EXPECT_GT(static_cast<double>(correct) / seen, 0.97) << correct << " of " << seen;
  EXPECT_GT(auc.Auc(), 0.98);
}

}  // namespace
}  // namespace pscluster::worker
