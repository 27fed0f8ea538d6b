#include "scheduler/job_yaml.h"

#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "common/limits.h"
#include "common/testing/status_matchers.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// A valid job; tests break one thing at a time. Line numbers matter: keep the layout.
constexpr char kGood[] = R"(name: mlp-test
model:
  kind: mlp
  hidden: [64, 32]
dataset:
  name: fashion_mnist
optimizer:
  kind: adam
  learning_rate: 0.001
consistency:
  mode: ssp
  staleness: 2
num_servers: 2
num_workers: 2
epochs: 3
batch_size: 64
export_path: /tmp/x.safetensors
)";

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  size_t pos = text.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  if (pos != std::string::npos) text.replace(pos, from.size(), to);
  return text;
}

TEST(JobYamlTest, ParsesEveryKindOfField) {
  auto spec = LoadJobYaml(kGood, "job.yaml");
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->name(), "mlp-test");
  EXPECT_EQ(spec->model().kind(), "mlp");
  ASSERT_EQ(spec->model().hidden_size(), 2);
  EXPECT_EQ(spec->model().hidden(1), 32u);
  EXPECT_EQ(spec->optimizer().kind(), v1::OptimizerSpec::ADAM);
  EXPECT_FLOAT_EQ(spec->optimizer().learning_rate(), 0.001f);
  EXPECT_EQ(spec->consistency().mode(), v1::ConsistencySpec::SSP);
  EXPECT_EQ(spec->consistency().staleness(), 2u);
  EXPECT_EQ(spec->num_servers(), 2u);
  // Defaults the scheduler relies on are filled in.
  EXPECT_EQ(spec->num_virtual_shards(), 64u);
  EXPECT_EQ(spec->replication(), 1u);
  EXPECT_EQ(spec->device(), "auto");
}

TEST(JobYamlTest, MapsAndEnumSpellings) {
  std::string text = std::string(kGood) + R"(table_optimizers:
  fc1.weight: {kind: SGD, learning_rate: 0.1, weight_decay: 0.0001}
table_compression:
  fc1.weight: {transport: fp16}
  fc2.weight:
    transport: DT_BFLOAT16
)";
  auto spec = LoadJobYaml(text, "job.yaml");
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->table_optimizers().at("fc1.weight").kind(), v1::OptimizerSpec::SGD);
  EXPECT_EQ(spec->table_compression().at("fc1.weight").transport(), v1::DT_FLOAT16);
  EXPECT_EQ(spec->table_compression().at("fc2.weight").transport(), v1::DT_BFLOAT16);
}

TEST(JobYamlTest, EmbeddingAdmissionAndExpiryPerTable) {
  std::string text = std::string(kGood) + R"(table_embedding:
  emb/*: {admit_after_pushes: 3, admit_sketch_bytes: 65536, expire_after_steps: 1000}
  wide/weight: {admit_probability: 0.25, expire_after_seconds: 3600}
)";
  auto spec = LoadJobYaml(text, "job.yaml");
  ASSERT_THAT(spec, IsOk());
  const v1::EmbeddingSpec& e = spec->table_embedding().at("emb/*");
  EXPECT_EQ(e.admit_after_pushes(), 3u);
  EXPECT_EQ(e.admit_sketch_bytes(), 65536u);
  EXPECT_EQ(e.expire_after_steps(), 1000u);
  EXPECT_FLOAT_EQ(spec->table_embedding().at("wide/weight").admit_probability(), 0.25f);
  EXPECT_EQ(spec->table_embedding().at("wide/weight").expire_after_seconds(), 3600u);
  // Refusals name the line and the member.
  EXPECT_THAT(LoadJobYaml(std::string(kGood) +
                              "table_embedding:\n  emb/*: {admit_after_pushes: 3, "
                              "admit_probability: 0.5}\n",
                          "job.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("job.yaml:19: table_embedding[emb/*]"
                                                  ".admit_probability:"),
                                       HasSubstr("cannot be combined"))));
  EXPECT_THAT(LoadJobYaml(std::string(kGood) + "table_embedding:\n  e: {admit_probability: 2}\n",
                          "job.yaml"),
              StatusIs(kInvalid, HasSubstr("table_embedding[e].admit_probability: must be in")));
  EXPECT_THAT(LoadJobYaml(std::string(kGood) + "table_embedding:\n  e*: {expire_after_steps: 2}\n",
                          "job.yaml"),
              StatusIs(kInvalid, HasSubstr("table_embedding[e*]: is not a valid table name")));
  EXPECT_THAT(LoadJobYaml(Replace(kGood, "mode: ssp\n  staleness: 2",
                                  "mode: bsp\n  aggregate: true") +
                              "table_embedding:\n  e: {expire_after_steps: 2}\n",
                          "job.yaml"),
              StatusIs(kInvalid, HasSubstr("not supported with consistency.aggregate")));
}

TEST(JobYamlTest, TableCompressionIsCheckedNamingTheKey) {
  auto load = [](const std::string& entries) {
    return LoadJobYaml(std::string(kGood) + "table_compression:\n" + entries, "job.yaml");
  };
  auto ok = load("  fc1.weight: {topk_ratio: 0.01}\n  \"*\": {quantize: int8}\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_FLOAT_EQ(ok->table_compression().at("fc1.weight").topk_ratio(), 0.01f);
  EXPECT_EQ(ok->table_compression().at("*").quantize(), v1::CompressionSpec::QUANTIZE_INT8);
  EXPECT_THAT(load("  fc1.weight: {topk_ratio: 1.5}\n"),
              StatusIs(kInvalid, AllOf(StartsWith("job.yaml:19: table_compression[fc1.weight]"
                                                  ".topk_ratio:"),
                                       HasSubstr("must be in [0, 1)"))));
  EXPECT_THAT(load("  fc1.weight: {topk_ratio: 0.1, quantize: int8}\n"),
              StatusIs(kInvalid, AllOf(HasSubstr("table_compression[fc1.weight].quantize:"),
                                       HasSubstr("cannot be combined"))));
  EXPECT_THAT(load("  fc1.weight: {quantize: int8, transport: fp16}\n"),
              StatusIs(kInvalid, HasSubstr("table_compression[fc1.weight].transport: quantize "
                                           "int8 needs float32 transport")));
  EXPECT_THAT(load("  fc1.weight: {quantize: int4}\n"),
              StatusIs(kInvalid, AllOf(HasSubstr("quantize"), HasSubstr("int8"))));
  // Pull compression, with or without compressed pushes.
  auto pulls = load("  \"*\": {topk_ratio: 0.01, pull_topk_ratio: 0.02, transport: fp16}\n");
  ASSERT_TRUE(pulls.ok()) << pulls.status();
  EXPECT_FLOAT_EQ(pulls->table_compression().at("*").pull_topk_ratio(), 0.02f);
  EXPECT_THAT(load("  fc1.weight: {pull_topk_ratio: -0.5}\n"),
              StatusIs(kInvalid, AllOf(HasSubstr("table_compression[fc1.weight].pull_topk_ratio:"),
                                       HasSubstr("must be in [0, 1)"))));
}

// Options that nothing carries out yet are refused at submission, saying so, never accepted and
// ignored.
TEST(JobYamlTest, OptionsNotSupportedYetAreRefused) {
  EXPECT_THAT(LoadJobYaml(Replace(Replace(kGood, "name: fashion_mnist", "name: synthetic_zipf"),
                                  "kind: mlp", "kind: sparse_linear"),
                          "job.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("job.yaml:6: dataset.name:"),
                                       HasSubstr("synthetic_zipf is not supported yet"))));
  EXPECT_THAT(LoadJobYaml(Replace(kGood, "name: fashion_mnist",
                                  "name: fashion_mnist\n  holdout_fraction: 0.1"),
                          "job.yaml"),
              StatusIs(kInvalid, HasSubstr("dataset.holdout_fraction: applies only to "
                                           "spam_assassin")));
}

TEST(JobYamlTest, NegativeStalenessNamesFileLineAndField) {
  std::string text = Replace(kGood, "staleness: 2", "staleness: -1");
  EXPECT_THAT(LoadJobYaml(text, "job.yaml"),
              StatusIs(kInvalid, StartsWith("job.yaml:12: consistency.staleness: must be >= 0")));
}

TEST(JobYamlTest, SemanticErrorsCarryTheLineOfTheField) {
  std::string text = Replace(kGood, "learning_rate: 0.001", "learning_rate: 0");
  EXPECT_THAT(LoadJobYaml(text, "job.yaml"),
              StatusIs(kInvalid, StartsWith("job.yaml:9: optimizer.learning_rate: must be")));
  text = Replace(kGood, "num_workers: 2", "num_workers: 0");
  EXPECT_THAT(LoadJobYaml(text, "job.yaml"),
              StatusIs(kInvalid, StartsWith("job.yaml:14: num_workers: must be >= 1")));
  text = Replace(kGood, "hidden: [64, 32]", "hidden: [64, 0]");
  EXPECT_THAT(LoadJobYaml(text, "job.yaml"),
              StatusIs(kInvalid, StartsWith("job.yaml:4: model.hidden[1]: must be in")));
}

TEST(JobYamlTest, MissingRequiredFieldNamesTheField) {
  std::string text = Replace(kGood, "num_servers: 2\n", "");
  EXPECT_THAT(LoadJobYaml(text, "job.yaml"),
              StatusIs(kInvalid, HasSubstr("num_servers: must be >= 1")));
  text = Replace(kGood, "optimizer:\n  kind: adam\n  learning_rate: 0.001\n", "");
  EXPECT_THAT(LoadJobYaml(text, "job.yaml"),
              StatusIs(kInvalid, StartsWith("job.yaml: optimizer: is required")));
}

TEST(JobYamlTest, UnknownFieldSuggestsTheClosestOne) {
  std::string text = Replace(kGood, "  hidden: [64, 32]", "  hiden: [64, 32]");
  EXPECT_THAT(LoadJobYaml(text, "job.yaml"),
              StatusIs(kInvalid, StartsWith("job.yaml:4: model.hiden: unknown field (did you "
                                            "mean 'hidden'?)")));
  text = Replace(kGood, "epochs: 3", "colour: blue");
  EXPECT_THAT(LoadJobYaml(text, "job.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("job.yaml:15: colour: unknown field"),
                                       HasSubstr("num_workers"))));
}

TEST(JobYamlTest, WrongTypesAndRanges) {
  EXPECT_THAT(LoadJobYaml(Replace(kGood, "epochs: 3", "epochs: three"), "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:15: epochs: must be a whole number")));
  EXPECT_THAT(LoadJobYaml(Replace(kGood, "epochs: 3", "epochs: 99999999999"), "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:15: epochs: is out of range")));
  EXPECT_THAT(LoadJobYaml(Replace(kGood, "kind: adam", "kind: rmsprop"), "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:8: optimizer.kind: must be one of sgd, "
                                            "momentum, adagrad, adam")));
  EXPECT_THAT(LoadJobYaml(Replace(kGood, "hidden: [64, 32]", "hidden: 64"), "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:4: model.hidden: expected a list")));
  EXPECT_THAT(LoadJobYaml(Replace(kGood, "  mode: ssp", "  mode: [ssp]"), "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:11: consistency.mode: expected a single")));
  EXPECT_THAT(LoadJobYaml(Replace(kGood, "epochs: 3", "epochs:"), "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:15: epochs: has no value")));
  EXPECT_THAT(LoadJobYaml(Replace(kGood, "  learning_rate: 0.001", "  learning_rate: 1e99"),
                          "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:9: optimizer.learning_rate: is out of range")));
}

TEST(JobYamlTest, DuplicateKeysAreRefused) {
  std::string text = std::string(kGood) + "epochs: 4\n";
  EXPECT_THAT(LoadJobYaml(text, "job.yaml"),
              StatusIs(kInvalid, StartsWith("job.yaml:18: epochs: duplicate key")));
}

TEST(JobYamlTest, BrokenYamlAndEmptyFiles) {
  EXPECT_THAT(LoadJobYaml("name: [unclosed\nepochs: 3\n", "bad.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("bad.yaml:"), HasSubstr("not valid YAML"))));
  EXPECT_THAT(LoadJobYaml("", "empty.yaml"),
              StatusIs(kInvalid, StartsWith("empty.yaml: the file is empty")));
  EXPECT_THAT(LoadJobYaml("- a\n- b\n", "list.yaml"),
              StatusIs(kInvalid, StartsWith("list.yaml:1: expected a mapping")));
}

TEST(JobYamlTest, CrossFieldRules) {
  // Staleness is SSP's alone.
  EXPECT_THAT(LoadJobYaml(Replace(kGood, "mode: ssp", "mode: bsp"), "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:12: consistency.staleness: applies only to "
                                            "mode: ssp")));
  // Replication above the server count.
  EXPECT_THAT(LoadJobYaml(std::string(kGood) + "replication: 3\n", "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:18: replication: must be at most "
                                            "num_servers (2)")));
  // Model and data must fit each other.
  EXPECT_THAT(LoadJobYaml(Replace(kGood, "name: fashion_mnist", "name: spam_assassin"), "j.yaml"),
              StatusIs(kInvalid, HasSubstr("model.kind: model 'mlp' cannot train on dataset "
                                           "'spam_assassin'")));
  EXPECT_THAT(LoadJobYaml(Replace(kGood, "/tmp/x.safetensors", "/tmp/x.bin"), "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:17: export_path: must name a .safetensors")));
  EXPECT_THAT(LoadJobYaml(std::string(kGood) + "checkpoint_every_steps: 10\n", "j.yaml"),
              StatusIs(kInvalid, HasSubstr("checkpoint_dir: is required")));
  EXPECT_THAT(LoadJobYaml(std::string(kGood) + "num_virtual_shards: 1\n", "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:18: num_virtual_shards:")));
  EXPECT_THAT(LoadJobYaml(std::string(kGood) + "device: cuda\n", "j.yaml"),
              StatusIs(kInvalid, HasSubstr("gpus_per_worker: must be >= 1 when device is cuda")));
  // TF32 is a CUDA option: refused where no CUDA worker would run the job.
  EXPECT_THAT(LoadJobYaml(std::string(kGood) + "allow_tf32: true\n", "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:18: allow_tf32: applies to CUDA workers")));
  EXPECT_THAT(LoadJobYaml(std::string(kGood) + "allow_tf32: true\ndevice: cpu\n", "j.yaml"),
              StatusIs(kInvalid, HasSubstr("allow_tf32: applies to CUDA workers")));
  EXPECT_THAT(LoadJobYaml(std::string(kGood) + "allow_tf32: true\ngpus_per_worker: 1\n"
                                               "device: cuda\n",
                          "j.yaml"),
              IsOk());
  // So are CUDA Graphs.
  EXPECT_THAT(LoadJobYaml(std::string(kGood) + "cuda_graphs: true\n", "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:18: cuda_graphs: applies to CUDA workers")));
  EXPECT_THAT(LoadJobYaml(std::string(kGood) + "cuda_graphs: true\ndevice: cpu\n", "j.yaml"),
              StatusIs(kInvalid, HasSubstr("cuda_graphs: applies to CUDA workers")));
  EXPECT_THAT(LoadJobYaml(std::string(kGood) + "cuda_graphs: true\ngpus_per_worker: 1\n",
                          "j.yaml"),
              IsOk());
  EXPECT_THAT(LoadJobYaml(Replace(kGood, "name: mlp-test", "name: bad name!"), "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:1: name: must be 1-64 characters")));
  EXPECT_THAT(LoadJobYaml(std::string(kGood) + "table_optimizers:\n  w: {kind: sgd, "
                                               "learning_rate: -1}\n",
                          "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:19: table_optimizers[w].learning_rate:")));
}

// The user's files (dataset.format): the reader's keys checked at submission with the worker's
// own code (data::DatasetOptionsOf), each error naming file:line and the key.
TEST(JobYamlTest, TheUsersDataIsCheckedAtSubmission) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  {
    std::ofstream(dir + "/train.svm") << "1 1:0.5 7:1\n0 2:1\n";
  }
  const std::string good = absl::StrCat(R"(name: lr
model:
  kind: sparse_linear
dataset:
  format: libsvm
  train: )", dir, R"(/train.svm
  holdout_fraction: 0.2
  num_features: 1000
optimizer:
  kind: adagrad
  learning_rate: 0.1
num_servers: 1
num_workers: 1
epochs: 1
batch_size: 8
export_path: /tmp/lr.safetensors
)");
  ASSERT_THAT(LoadJobYaml(good, "j.yaml"), IsOk());
  // A format, a key of the reader, a value out of range: each names its line and key.
  EXPECT_THAT(LoadJobYaml(Replace(good, "format: libsvm", "format: parquet"), "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:5: dataset.format:"),
                                       HasSubstr("parquet"))));
  EXPECT_THAT(LoadJobYaml(Replace(good, "holdout_fraction: 0.2", "holdout_fraction: 1.5"),
                          "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:7: dataset.holdout_fraction:")));
  EXPECT_THAT(LoadJobYaml(Replace(good, "num_features: 1000", "num_features: 1000\n  on_error: "
                                                               "ignore"),
                          "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:9: dataset.on_error:")));
  // The built-in sets' keys do not apply to the user's files.
  EXPECT_THAT(LoadJobYaml(Replace(good, "num_features: 1000", "num_features: 1000\n  hash_bits: "
                                                               "20"),
                          "j.yaml"),
              StatusIs(kInvalid, HasSubstr("dataset.hash_bits")));
  // A path the scheduler can see is not there.
  EXPECT_THAT(LoadJobYaml(Replace(good, "/train.svm", "/nothing.svm"), "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:6: dataset.train:"),
                                       HasSubstr("nothing.svm: no such file"))));
  EXPECT_THAT(LoadJobYaml(Replace(good, "/train.svm", "/*.nomatch"), "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:6: dataset.train:")));
  // One on a machine the scheduler cannot see into is left to the workers.
  EXPECT_THAT(LoadJobYaml(Replace(good, dir + "/train.svm", "/mnt/not-mounted-here/train.svm"),
                          "j.yaml"),
              IsOk());
  // The model must read what the data holds.
  EXPECT_THAT(LoadJobYaml(Replace(good, "kind: sparse_linear", "kind: softmax"), "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:3: model.kind:"),
                                       HasSubstr("use sparse_linear"))));
  // An export writes every key of the key space: it must be bounded.
  EXPECT_THAT(LoadJobYaml(Replace(good, "  num_features: 1000\n", ""), "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:15: export_path:"),
                                       HasSubstr("unbounded"))));
  // Dense and categorical columns together need the model graph: refused, not half-read.
  const std::string csv = Replace(Replace(Replace(good, "format: libsvm", "format: csv"),
                                          "  num_features: 1000\n",
                                          "  columns:\n    - {name: city, kind: categorical}\n"),
                                  "kind: sparse_linear", "kind: softmax");
  EXPECT_THAT(LoadJobYaml(csv, "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:5: dataset.format:"),
                                       HasSubstr("kind graph reads both"))));
}

// A layer graph (model kind graph) is checked at submission: each error names the file, the
// line and the layer's key.
TEST(JobYamlTest, TheLayerGraphIsCheckedAtSubmission) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  {
    std::ofstream(dir + "/train.tsv") << "1\t1\t\t\t\t\t\t\t\t\t\t\t\t\t" << std::string(25, '\t') << "\n";
    std::ofstream(dir + "/train.svm") << "1 1:0.5 7:1\n";
  }
  const std::string good = absl::StrCat(R"(name: wd
model:
  kind: graph
  layers:
    - {name: dense, type: dense_input}
    - {name: cat, type: categorical_input}
    - {name: wide, type: linear, inputs: [cat]}
    - {name: emb, type: embedding, inputs: [cat], width: 8}
    - {name: deep_in, type: concat, inputs: [dense, emb]}
    - {name: deep, type: mlp, inputs: [deep_in], widths: [16, 1]}
    - {name: logit, type: add, inputs: [wide, deep]}
    - {name: head, type: sigmoid, inputs: [logit]}
dataset:
  format: criteo
  train: )", dir, R"(/train.tsv
  holdout_fraction: 0.2
optimizer:
  kind: adagrad
  learning_rate: 0.1
num_servers: 1
num_workers: 1
epochs: 1
batch_size: 8
)");
  // Dense and categorical features together are fine for a graph.
  ASSERT_THAT(LoadJobYaml(good, "j.yaml"), IsOk());
  // So is an export (its sparse tables at the keys the servers hold), of a .safetensors file.
  EXPECT_THAT(LoadJobYaml(good + "export_path: /tmp/m.safetensors\n", "j.yaml"), IsOk());
  EXPECT_THAT(LoadJobYaml(good + "export_path: /tmp/m.bin\n", "j.yaml"),
              StatusIs(kInvalid, HasSubstr("export_path: must name a .safetensors file")));
  // An unknown layer type.
  EXPECT_THAT(LoadJobYaml(Replace(good, "type: add", "type: multiply"), "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:11: model.layers[6].type:"),
                                       HasSubstr("unknown layer type 'multiply'"))));
  // An input that names no layer, or a later one.
  EXPECT_THAT(LoadJobYaml(Replace(good, "inputs: [wide, deep]", "inputs: [wide, dep]"), "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:11: model.layers[6].inputs[1]:"),
                                       HasSubstr("'dep' names no earlier layer"))));
  EXPECT_THAT(LoadJobYaml(Replace(good, "inputs: [dense, emb]", "inputs: [dense, deep]"), "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:9: model.layers[4].inputs[1]:"),
                                       HasSubstr("names no earlier layer"))));
  // A layer that does not lead to the head.
  EXPECT_THAT(
      LoadJobYaml(Replace(good, "    - {name: deep_in",
                          "    - {name: extra, type: embedding, inputs: [cat], width: 4}\n"
                          "    - {name: deep_in"),
                  "j.yaml"),
      StatusIs(kInvalid, AllOf(StartsWith("j.yaml:9: model.layers[4]:"),
                               HasSubstr("does not lead to the head"))));
  // Widths that do not match: an add of 1 and 2 features, a sigmoid head over 2.
  EXPECT_THAT(LoadJobYaml(Replace(good, "widths: [16, 1]", "widths: [16, 2]"), "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:11: model.layers[6].inputs[1]:"),
                                       HasSubstr("widths do not match"))));
  EXPECT_THAT(LoadJobYaml(Replace(good, "type: add", "type: concat"), "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:12: model.layers[7].inputs:"),
                                       HasSubstr("widths do not match"))));
  // A field used twice.
  EXPECT_THAT(LoadJobYaml(Replace(good, "type: categorical_input}",
                                  "type: categorical_input, fields: [C1, C2, C1]}"),
                          "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:6: model.layers[1].fields[2]:"),
                                       HasSubstr("field 'C1' is used twice"))));
  // A missing width, a key that does not apply to the type, a head that is not last.
  EXPECT_THAT(LoadJobYaml(Replace(good, ", width: 8}", "}"), "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:8: model.layers[3].width:")));
  EXPECT_THAT(LoadJobYaml(Replace(good, "inputs: [dense, emb]}", "inputs: [dense, emb], width: 3}"),
                          "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:9: model.layers[4].width:"),
                                       HasSubstr("does not apply to a concat layer"))));
  EXPECT_THAT(LoadJobYaml(Replace(good, "type: add", "type: sigmoid"), "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:11: model.layers[6].type:")));
  // fm and dot_interaction need vectors of one width.
  EXPECT_THAT(LoadJobYaml(Replace(good, "type: mlp, inputs: [deep_in], widths: [16, 1]",
                                  "type: fm, inputs: [dense]"),
                          "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:10: model.layers[5].inputs:"),
                                       HasSubstr("two or more vectors"))));
  // The data must hold what the inputs read.
  EXPECT_THAT(LoadJobYaml(Replace(Replace(good, "format: criteo", "format: libsvm"), "/train.tsv",
                                  "/train.svm"),
                          "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:5: model.layers[0].type:"),
                                       HasSubstr("no dense features"))));
  // What the workers fill from the data is not for the job file; layers are for graphs only.
  EXPECT_THAT(LoadJobYaml(Replace(good, "  kind: graph\n", "  kind: graph\n  key_space: 100\n"),
                          "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:4: model.key_space:")));
  EXPECT_THAT(LoadJobYaml(Replace(good, "kind: graph", "kind: sparse_linear"), "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:4: model.layers:")));
  // conv2d, mlp names and init_stddev: checked as the other keys.
  EXPECT_THAT(LoadJobYaml(Replace(good, "{name: deep_in, type: concat, inputs: [dense, emb]}",
                                  "{name: deep_in, type: conv2d, inputs: [dense]}"),
                          "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:9: model.layers[4].channels:"),
                                       HasSubstr("channels in [1, 4096]"))));
  EXPECT_THAT(LoadJobYaml(Replace(good, "{name: deep_in, type: concat, inputs: [dense, emb]}",
                                  "{name: deep_in, type: conv2d, inputs: [dense], channels: 4, "
                                  "kernel: 4}"),
                          "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:9: model.layers[4].kernel:"),
                                       HasSubstr("must be odd"))));
  EXPECT_THAT(LoadJobYaml(Replace(good, "{name: deep_in, type: concat, inputs: [dense, emb]}",
                                  "{name: deep_in, type: conv2d, inputs: [emb], channels: 4}"),
                          "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:9: model.layers[4].inputs:"),
                                       HasSubstr("reads a dense_input or a conv2d"))));
  EXPECT_THAT(LoadJobYaml(Replace(good, "{name: deep_in, type: concat, inputs: [dense, emb]}",
                                  "{name: image, type: conv2d, inputs: [dense], channels: 4}\n"
                                  "    - {name: deep_in, type: concat, inputs: [image, emb]}"),
                          "j.yaml"),
              IsOk());
  EXPECT_THAT(
      LoadJobYaml(Replace(good, "widths: [16, 1]}", "widths: [16, 1], names: [a]}"), "j.yaml"),
      StatusIs(kInvalid, AllOf(StartsWith("j.yaml:10: model.layers[5].names:"),
                               HasSubstr("1 names for 2 widths"))));
  EXPECT_THAT(
      LoadJobYaml(Replace(good, "widths: [16, 1]}", "widths: [16, 1], channels: 2}"), "j.yaml"),
      StatusIs(kInvalid, AllOf(StartsWith("j.yaml:10: model.layers[5].channels:"),
                               HasSubstr("does not apply to a mlp layer"))));
  EXPECT_THAT(LoadJobYaml(Replace(good, "widths: [16, 1]}", "widths: [16, 1], init_stddev: 0.1}"),
                          "j.yaml"),
              StatusIs(kInvalid, StartsWith("j.yaml:10: model.layers[5].init_stddev:")));
  EXPECT_THAT(LoadJobYaml(Replace(good, "width: 8}", "width: 8, init_stddev: -1}"), "j.yaml"),
              StatusIs(kInvalid, AllOf(StartsWith("j.yaml:8: model.layers[3].init_stddev:"),
                                       HasSubstr("must be in [0, 10]"))));
  EXPECT_THAT(LoadJobYaml(Replace(good, "width: 8}", "width: 8, init_stddev: 0.05}"), "j.yaml"),
              IsOk());
}

// What the servers limit is refused at submission, from the same constants (common/limits.h):
// the largest value a server takes passes, one more does not.
TEST(JobYamlTest, TheServersLimitsAreCheckedAtSubmission) {
  const std::string shards = absl::StrCat("num_virtual_shards: ", kMaxVirtualShards, "\n");
  EXPECT_THAT(LoadJobYaml(std::string(kGood) + shards, "j.yaml"), IsOk());
  EXPECT_THAT(
      LoadJobYaml(absl::StrCat(kGood, "num_virtual_shards: ", kMaxVirtualShards + 1, "\n"), "j.yaml"),
      StatusIs(kInvalid, StartsWith(absl::StrCat("j.yaml:18: num_virtual_shards: must be at most ",
                                                 kMaxVirtualShards))));
  EXPECT_THAT(LoadJobYaml(Replace(kGood, "num_workers: 2", absl::StrCat("num_workers: ",
                                                                         kMaxWorkers)),
                          "j.yaml"),
              IsOk());
  EXPECT_THAT(LoadJobYaml(Replace(kGood, "num_workers: 2",
                                  absl::StrCat("num_workers: ", kMaxWorkers + 1)),
                          "j.yaml"),
              StatusIs(kInvalid, StartsWith(absl::StrCat("j.yaml:14: num_workers: must be at most ",
                                                         kMaxWorkers))));
  // A layer whose weights would need more blocks than a server gives one table.
  EXPECT_THAT(LoadJobYaml(Replace(kGood, "hidden: [64, 32]", "hidden: [1000000, 1000000]"),
                          "j.yaml"),
              StatusIs(kInvalid, HasSubstr("model.hidden[1]: a layer of 1000000 x 1000000")));
}

// The scheduler parses job files sent over SubmitJob: hostile text must give a status, never
// crash the daemon. Nesting deep enough to exhaust a recursive parser's stack, anchors and
// aliases, huge numbers and long strings.
TEST(JobYamlTest, HostileTextIsRefusedWithoutCrashing) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"deep flow sequence", "name: x\nmodel: " + std::string(100000, '[')},
      {"deep flow mapping", "name: x\nmodel: " + std::string(100000, '{')},
      {"deep block sequence", [] {
         std::string t = "model:\n";
         for (int i = 0; i < 20000; ++i) t += std::string(i % 200, ' ') + "- \n";
         return t;
       }()},
      {"alias of itself", "a: &a [*a]\nname: x\n"},
      {"alias bomb", "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
                     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c]\n"},
      {"undefined alias", "name: *nope\n"},
      {"huge number", std::string(kGood).replace(std::string(kGood).find("epochs: 3"), 9,
                                                 "epochs: 99999999999999999999999999")},
      {"long string", "name: " + std::string(1 << 20, 'n') + "\n"},
      {"nul bytes", std::string("name: a\0b\nepochs: 3\n", 20)},
      {"tabs", "name:\tx\n\tepochs: 3\n"},
  };
  for (const auto& [what, text] : cases) {
    auto spec = LoadJobYaml(text, "hostile.yaml");
    EXPECT_FALSE(spec.ok()) << what;
    EXPECT_THAT(std::string(spec.status().message()), StartsWith("hostile.yaml")) << what;
  }
}

// Random damage to a valid job file: characters replaced by YAML's syntax characters, lines
// dropped, repeated or re-indented, the text cut. Every result parses or gives a status naming
// the file.
TEST(JobYamlTest, RandomlyDamagedJobFilesGiveAStatus) {
  std::mt19937_64 rng(7);
  const std::string syntax = ":-[]{}&*!|>'\"%@`#,? \t\n0123456789.eE+";
  int refused = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string text = kGood;
    for (int m = 0, n = 1 + static_cast<int>(rng() % 4); m < n; ++m) {
      const size_t at = rng() % text.size();
      switch (rng() % 5) {
        case 0: text[at] = syntax[rng() % syntax.size()]; break;
        case 1: text.insert(at, 1, syntax[rng() % syntax.size()]); break;
        case 2: text.erase(at, 1 + rng() % 20); break;
        case 3: text.insert(text.rfind('\n', at) + 1, std::string(rng() % 6, ' ')); break;
        default: text.resize(std::max<size_t>(at, 1)); break;
      }
      if (text.empty()) text = "x";
    }
    auto spec = LoadJobYaml(text, "damaged.yaml");
    if (!spec.ok()) {
      ++refused;
      EXPECT_THAT(std::string(spec.status().message()), StartsWith("damaged.yaml")) << text;
    }
  }
  EXPECT_GT(refused, 1000);
}

TEST(JobYamlTest, RoundTripsThroughYaml) {
  auto spec = LoadJobYaml(kGood, "job.yaml");
  ASSERT_THAT(spec, IsOk());
  std::string text = JobSpecToYaml(*spec);
  EXPECT_THAT(text, HasSubstr("kind: adam"));
  EXPECT_THAT(text, HasSubstr("mode: ssp"));
  auto again = LoadJobYaml(text, "round.yaml");
  ASSERT_THAT(again, IsOk()) << text;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*spec, *again))
      << spec->DebugString() << "\nvs\n" << again->DebugString();
}

constexpr char kEntrypoint[] = R"(name: mine
entrypoint:
  command: [python3, train.py, --lr, "0.1"]
  working_dir: /srv/train
  env:
    OMP_NUM_THREADS: "1"
optimizer:
  kind: sgd
  learning_rate: 0.1
num_servers: 1
num_workers: 2
)";

TEST(JobYamlTest, EntrypointJobParsesWithoutModelDataEpochsOrBatch) {
  auto spec = LoadJobYaml(kEntrypoint, "job.yaml");
  ASSERT_THAT(spec, IsOk());
  ASSERT_EQ(spec->entrypoint().command_size(), 4);
  EXPECT_EQ(spec->entrypoint().command(3), "0.1");
  EXPECT_EQ(spec->entrypoint().working_dir(), "/srv/train");
  EXPECT_EQ(spec->entrypoint().env().at("OMP_NUM_THREADS"), "1");
  EXPECT_FALSE(spec->has_model());
  // epochs and batch_size, when given, reach the script in its task file.
  EXPECT_THAT(LoadJobYaml(absl::StrCat(kEntrypoint, "epochs: 3\nbatch_size: 32\n"), "job.yaml"),
              IsOk());
}

TEST(JobYamlTest, EntrypointRefusesTheBuiltInTrainersKeysAndBadCommands) {
  const std::string base = kEntrypoint;
  struct Case {
    std::string yaml;
    std::string error;
  };
  const Case cases[] = {
      {base + "model:\n  kind: mlp\n", "job.yaml:12: model: describes the built-in trainer"},
      {base + "dataset:\n  name: fashion_mnist\n", "job.yaml:12: dataset: describes"},
      {base + "export_path: /tmp/m.safetensors\n", "job.yaml:12: export_path: is written by"},
      {base + "balance_data: true\n", "job.yaml:12: balance_data: is not supported"},
      {base + "eval_batch_size: 10\n", "job.yaml:12: eval_batch_size: describes"},
      {base + "cuda_graphs: true\n", "job.yaml:12: cuda_graphs: describes"},
      {base + "table_compression:\n  w:\n    transport: float16\n",
       "job.yaml:12: table_compression: is applied by the built-in"},
      {Replace(base, "[python3, train.py, --lr, \"0.1\"]", "[]"),
       "job.yaml:3: entrypoint.command: is required"},
      {Replace(base, "/srv/train", "relative/dir"),
       "job.yaml:4: entrypoint.working_dir: must be an absolute path"},
      {Replace(base, "OMP_NUM_THREADS", "PSCLUSTER_RANK"),
       "entrypoint.env[PSCLUSTER_RANK]: PSCLUSTER_ variables are set by the worker"},
      {Replace(base, "OMP_NUM_THREADS", "1BAD"), "entrypoint.env[1BAD]: is not a variable name"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(LoadJobYaml(c.yaml, "job.yaml"), StatusIs(kInvalid, HasSubstr(c.error)))
        << c.yaml;
  }
}

TEST(JobYamlTest, EveryShippedExampleIsValid) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  ASSERT_NE(srcdir, nullptr);
  for (const char* name : {"fashion_mlp", "fashion_mlp_ssp", "fashion_mlp_asp", "spam_sparse",
                           "fashion_cnn", "libsvm_linear", "fashion_csv_mlp", "ctr_wide_deep",
                           "ctr_dlrm", "ctr_lr"}) {
    std::string path = absl::StrCat(srcdir, "/pscluster/deploy/examples/", name, ".yaml");
    std::ifstream f(path);
    ASSERT_TRUE(f.good()) << path;
    std::stringstream ss;
    ss << f.rdbuf();
    auto spec = LoadJobYaml(ss.str(), name);
    EXPECT_THAT(spec, IsOk()) << name;
  }
}

}  // namespace
}  // namespace pscluster::scheduler
