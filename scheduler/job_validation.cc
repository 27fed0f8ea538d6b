#include "scheduler/job_validation.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/compression_spec.h"
#include "common/sharding.h"
#include "kernels/models/graph_spec.h"
#include "server/embedding_policy.h"
#include "worker/data/dataset_spec.h"

namespace pscluster::scheduler {
namespace {

bool NameChars(absl::string_view s, absl::string_view extra) {
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              extra.find(c) != absl::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

bool ValidTableName(absl::string_view s) {
  return !s.empty() && s.size() <= 128 && NameChars(s, "_./-");
}

// Collects the first error; later checks are skipped once one failed.
class Checker {
 public:
  explicit Checker(const JobSource& where) : where_(where) {}

  // Records an error for `path` unless `ok`.
  void Require(bool ok, absl::string_view path, absl::string_view message) {
    if (status_.ok() && !ok) status_ = where_.Error(path, message);
  }
  bool failed() const { return !status_.ok(); }
  absl::Status status() const { return status_; }

 private:
  const JobSource& where_;
  absl::Status status_;
};

void CheckOptimizer(const v1::OptimizerSpec& o, const std::string& p, Checker& c) {
  auto f = [&](absl::string_view name) { return absl::StrCat(p, ".", name); };
  c.Require(std::isfinite(o.learning_rate()) && o.learning_rate() > 0, f("learning_rate"),
            absl::StrCat("must be a finite number > 0 (got ", o.learning_rate(), ")"));
  c.Require(std::isfinite(o.weight_decay()) && o.weight_decay() >= 0, f("weight_decay"),
            "must be a finite number >= 0");
  c.Require(std::isfinite(o.momentum()) && o.momentum() >= 0 && o.momentum() < 1, f("momentum"),
            "must be in [0, 1)");
  c.Require(std::isfinite(o.beta1()) && o.beta1() >= 0 && o.beta1() < 1, f("beta1"),
            "must be in [0, 1) (0 = default 0.9)");
  c.Require(std::isfinite(o.beta2()) && o.beta2() >= 0 && o.beta2() < 1, f("beta2"),
            "must be in [0, 1) (0 = default 0.999)");
  c.Require(std::isfinite(o.epsilon()) && o.epsilon() >= 0, f("epsilon"),
            "must be a finite number >= 0");
  c.Require(std::isfinite(o.initial_accumulator()) && o.initial_accumulator() >= 0,
            f("initial_accumulator"), "must be a finite number >= 0");
  c.Require(o.kind() == v1::OptimizerSpec::MOMENTUM || (o.momentum() == 0 && !o.nesterov()),
            f(o.nesterov() ? "nesterov" : "momentum"), "applies only to kind: momentum");
  c.Require(o.kind() == v1::OptimizerSpec::ADAM ||
                (o.beta1() == 0 && o.beta2() == 0 && !o.decoupled_weight_decay()),
            f(o.decoupled_weight_decay() ? "decoupled_weight_decay"
                                         : (o.beta1() != 0 ? "beta1" : "beta2")),
            "applies only to kind: adam");
  c.Require(o.kind() == v1::OptimizerSpec::ADAGRAD || o.initial_accumulator() == 0,
            f("initial_accumulator"), "applies only to kind: adagrad");
  c.Require(std::isfinite(o.lr_min_ratio()) && o.lr_min_ratio() >= 0 && o.lr_min_ratio() <= 1,
            f("lr_min_ratio"), "must be in [0, 1]");
  c.Require(o.lr_decay_steps() <= kMaxScheduleSteps, f("lr_decay_steps"),
            absl::StrCat("must be at most ", kMaxScheduleSteps));
  c.Require(o.lr_warmup_steps() <= kMaxScheduleSteps, f("lr_warmup_steps"),
            absl::StrCat("must be at most ", kMaxScheduleSteps));
  c.Require(o.lr_schedule() == v1::OptimizerSpec::COSINE ||
                (o.lr_decay_steps() == 0 && o.lr_min_ratio() == 0),
            f(o.lr_decay_steps() != 0 ? "lr_decay_steps" : "lr_min_ratio"),
            "applies only to lr_schedule: cosine");
}

void RequireOk(const absl::Status& s, Checker& c);

void CheckCompression(const v1::CompressionSpec& cs, const std::string& p, Checker& c) {
  c.Require(cs.transport() == v1::DT_INVALID || cs.transport() == v1::DT_FLOAT32 ||
                cs.transport() == v1::DT_FLOAT16 || cs.transport() == v1::DT_BFLOAT16,
            p + ".transport", "must be float32, float16 or bfloat16");
  RequireOk(CheckCompressionSpec(cs, p), c);  // Its message starts with the field it names.
}

// Records a "path: message" error from the model code under its path.
void RequireOk(const absl::Status& s, Checker& c) {
  if (s.ok()) return;
  const absl::string_view m = s.message();
  const size_t colon = m.find(": ");
  c.Require(false, colon == absl::string_view::npos ? "model" : m.substr(0, colon),
            colon == absl::string_view::npos ? m : m.substr(colon + 2));
}

// A layer graph: its structure here (kernels/models/graph_spec.h, the code the workers build it
// with); what depends on the data's sizes, when the workers have read it.
void CheckGraph(const v1::JobSpec& spec, Checker& c) {
  const v1::ModelSpec& m = spec.model();
  c.Require(m.input_dim() == 0, "model.input_dim",
            "is filled by the workers from the data for kind graph; leave it out");
  c.Require(m.num_classes() != 1, "model.num_classes", "must be >= 2 (or 0 = from the data)");
  RequireOk(kernels::PlanGraph(m, /*data_known=*/false).status(), c);
  c.Require(data::IsStreamed(spec.dataset()), "model.kind",
            "a graph model reads the user's files (dataset.format), not a built-in data set");
}

void CheckModel(const v1::JobSpec& spec, Checker& c) {
  const v1::ModelSpec& m = spec.model();
  const std::string& k = m.kind();
  c.Require(!k.empty(), "model.kind", "is required (softmax, mlp, cnn, sparse_linear or graph)");
  c.Require(k.empty() || k == "softmax" || k == "mlp" || k == "cnn" || k == "sparse_linear" ||
                k == "graph",
            "model.kind",
            absl::StrCat("must be softmax, mlp, cnn, sparse_linear or graph (got '", k, "')"));
  if (k == "graph") {
    CheckGraph(spec, c);
    return;
  }
  c.Require(m.layers_size() == 0, "model.layers", "applies only to kind graph");
  c.Require(m.input_fields_size() == 0, "model.input_fields", "applies only to kind graph");
  c.Require(m.key_space() == 0, "model.key_space", "applies only to kind graph");
  c.Require(k != "mlp" || m.hidden_size() > 0, "model.hidden",
            "an mlp needs at least one hidden layer width");
  c.Require(k == "mlp" || k == "sparse_linear" || m.hidden_size() == 0, "model.hidden",
            "applies only to mlp and sparse_linear models");
  for (int i = 0; i < m.hidden_size(); ++i) {
    c.Require(m.hidden(i) > 0 && m.hidden(i) <= 1000000, absl::StrCat("model.hidden[", i, "]"),
              "must be in [1, 1000000]");
  }
  c.Require(m.num_classes() != 1, "model.num_classes", "must be >= 2 (or 0 = from the data)");
  c.Require(m.activation().empty() || m.activation() == "relu" || m.activation() == "gelu",
            "model.activation", absl::StrCat("must be relu or gelu (got '", m.activation(), "')"));
  c.Require(k == "cnn" || m.conv_channels_size() == 0, "model.conv_channels",
            "applies only to cnn models");
  c.Require(m.conv_channels_size() == 0 || m.conv_channels_size() == 2, "model.conv_channels",
            "must list the output channels of the two conv layers");
  for (int i = 0; i < m.conv_channels_size(); ++i) {
    c.Require(m.conv_channels(i) > 0 && m.conv_channels(i) <= 4096,
              absl::StrCat("model.conv_channels[", i, "]"), "must be in [1, 4096]");
  }
  c.Require(k != "sparse_linear" || m.embedding_dim() <= 4096, "model.embedding_dim",
            "must be at most 4096");
  // Each layer's weights are one dense table in blocks of kDefaultBlockElems: the servers hold at
  // most kMaxBlocks blocks per table.
  const uint64_t max_elems = std::min(kMaxTableElems, kMaxBlocks * kDefaultBlockElems);
  std::vector<std::pair<uint64_t, std::string>> widths;
  if (m.input_dim() != 0 && k != "sparse_linear") widths.push_back({m.input_dim(), "model.input_dim"});
  for (int i = 0; i < m.hidden_size(); ++i) {
    widths.push_back({m.hidden(i), absl::StrCat("model.hidden[", i, "]")});
  }
  if (m.num_classes() != 0) widths.push_back({m.num_classes(), "model.num_classes"});
  for (size_t i = 1; i < widths.size(); ++i) {
    const uint64_t elems = widths[i - 1].first * widths[i].first;
    c.Require(elems <= max_elems, widths[i].second,
              absl::StrCat("a layer of ", widths[i - 1].first, " x ", widths[i].first, " = ",
                           elems, " weights exceeds the ", max_elems,
                           " elements a server holds in one table"));
  }
  c.Require(k == "sparse_linear" || m.embedding_dim() == 0, "model.embedding_dim",
            "applies only to sparse_linear models");
}

// Whether the scheduler can tell that `path` (a file, a directory or a glob) names nothing: its
// directory exists here but nothing in it matches. A path whose directory this machine does not
// have may be on the workers' file system: the workers' tasks report it then.
bool VisiblyMissing(const std::string& path) {
  const bool glob = path.find_first_of("*?[") != std::string::npos;
  const size_t slash = path.rfind('/', glob ? path.find_first_of("*?[") : std::string::npos);
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  if (!glob) return ::stat(path.c_str(), &st) != 0;
  glob_t g;
  const int rc = ::glob(path.c_str(), 0, nullptr, &g);
  const bool none = rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0);
  if (rc == 0) ::globfree(&g);
  return none;
}

// The user's files (dataset.format): the keys as the workers will read them, the files where
// the scheduler can see them, and a model that reads what the data holds.
void CheckStreamedDataset(const v1::JobSpec& spec, Checker& c) {
  const v1::DatasetSpec& d = spec.dataset();
  auto options = data::DatasetOptionsOf(d, spec.seed());
  if (!options.ok()) {
    const absl::string_view m = options.status().message();
    const size_t colon = m.find(": ");
    c.Require(false, colon == absl::string_view::npos ? "dataset" : m.substr(0, colon),
              colon == absl::string_view::npos ? m : m.substr(colon + 2));
    return;
  }
  for (const auto& [key, path] : {std::pair<const char*, std::string>{"dataset.train", d.train()},
                                  {"dataset.test", d.test()}}) {
    c.Require(path.empty() || !VisiblyMissing(path), key,
              absl::StrCat(path, ": no such file, directory or matching files"));
  }
  const data::DataFormat f = options->format;
  const bool csv = f == data::DataFormat::kCsv || f == data::DataFormat::kTsv;
  // What the examples hold: keys (libsvm's features, categorical fields) and dense values.
  bool categorical = f == data::DataFormat::kLibSvm || f == data::DataFormat::kCriteo;
  bool dense = f == data::DataFormat::kCriteo;
  if (csv) {
    // Undeclared columns are other_columns.
    categorical = options->other_columns == data::ColumnKind::kCategorical;
    dense = options->other_columns == data::ColumnKind::kDense;
    for (const data::ColumnOptions& col : options->columns) {
      categorical = categorical || col.kind == data::ColumnKind::kCategorical;
      dense = dense || col.kind == data::ColumnKind::kDense;
    }
  }
  const std::string& k = spec.model().kind();
  if (k == "graph") {
    // The graph reads what its inputs name; the data must hold it.
    const v1::ModelSpec& m = spec.model();
    for (int i = 0; i < m.layers_size(); ++i) {
      const std::string& t = m.layers(i).type();
      c.Require(t != "dense_input" || dense, absl::StrCat("model.layers[", i, "].type"),
                absl::StrCat("the ", data::DataFormatName(f), " data has no dense features",
                             csv ? " (declare dense columns, or other_columns: dense)" : ""));
      c.Require(t != "categorical_input" || categorical,
                absl::StrCat("model.layers[", i, "].type"),
                absl::StrCat("the ", data::DataFormatName(f), " data has no categorical features",
                             csv ? " (declare categorical columns)" : ""));
    }
    return;
  }
  c.Require(!(categorical && dense), "dataset.format",
            absl::StrCat(data::DataFormatName(f), " data with both dense and categorical "
                         "features is not supported by the model kinds softmax, mlp, cnn "
                         "and sparse_linear (each reads one of the two; kind graph reads both)",
                         csv ? "; columns not declared read as other_columns, dense unless "
                               "set otherwise"
                             : ""));
  if (!k.empty()) {
    c.Require(categorical == (k == "sparse_linear"), "model.kind",
              absl::StrCat("model '", k, "' cannot read ", data::DataFormatName(f), " data ",
                           categorical ? "with categorical or sparse features (use sparse_linear)"
                                       : "of dense features (use softmax, mlp or cnn)"));
  }
  const uint64_t keys = data::KeySpaceOf(*options);
  c.Require(!categorical || spec.export_path().empty() || (keys > 0 && keys <= kMaxExportKeys),
            "export_path",
            absl::StrCat("exporting a model of the user's sparse data needs a bounded key space "
                         "of at most ", kMaxExportKeys, " keys (",
                         keys == 0 ? "this one is unbounded: set dataset.num_features"
                                   : absl::StrCat("this one has ", keys),
                         "); leave export_path empty"));
}

void CheckDataset(const v1::JobSpec& spec, Checker& c) {
  const v1::DatasetSpec& d = spec.dataset();
  if (data::IsStreamed(d)) {
    CheckStreamedDataset(spec, c);
    return;
  }
  const std::string& n = d.name();
  c.Require(!n.empty(), "dataset.name", "is required (fashion_mnist or spam_assassin)");
  c.Require(n != "synthetic_zipf", "dataset.name",
            "synthetic_zipf is not supported yet: no worker generates it (use fashion_mnist or "
            "spam_assassin)");
  c.Require(n.empty() || n == "fashion_mnist" || n == "spam_assassin" || n == "synthetic_zipf",
            "dataset.name",
            absl::StrCat("must be fashion_mnist or spam_assassin (got '", n, "')"));
  bool sparse_data = n == "spam_assassin";
  const std::string& k = spec.model().kind();
  if (!k.empty() && !n.empty()) {
    c.Require(sparse_data == (k == "sparse_linear"), "model.kind",
              absl::StrCat("model '", k, "' cannot train on dataset '", n, "' (",
                           sparse_data ? "sparse data needs sparse_linear"
                                       : "sparse_linear needs spam_assassin",
                           ")"));
  }
  c.Require(d.hash_bits() == 0 || (sparse_data && d.hash_bits() <= 40), "dataset.hash_bits",
            sparse_data ? "must be at most 40" : "applies only to spam_assassin");
  c.Require(std::isfinite(d.holdout_fraction()) && d.holdout_fraction() >= 0 &&
                d.holdout_fraction() < 1,
            "dataset.holdout_fraction", "must be in [0, 1)");
  c.Require(d.holdout_fraction() == 0 || sparse_data, "dataset.holdout_fraction",
            "applies only to spam_assassin (fashion_mnist has its own test set)");
  c.Require(d.num_examples() == 0, "dataset.num_examples",
            "is not supported yet (it was for synthetic_zipf, which no worker generates)");
  c.Require(d.zipf_exponent() == 0, "dataset.zipf_exponent",
            "is not supported yet (it was for synthetic_zipf, which no worker generates)");
}

bool EnvName(absl::string_view s) {
  return !s.empty() && !(s[0] >= '0' && s[0] <= '9') && NameChars(s, "_");
}

// The user's command (entrypoint), and the keys of the built-in trainer it leaves no meaning to:
// those are refused rather than ignored.
void CheckEntrypoint(const v1::JobSpec& spec, Checker& c) {
  const v1::EntrypointSpec& e = spec.entrypoint();
  c.Require(e.command_size() > 0 && !e.command(0).empty(), "entrypoint.command",
            "is required: the program and its arguments, e.g. [python3, train.py]");
  c.Require(e.command_size() <= 4096, "entrypoint.command", "has more than 4096 arguments");
  size_t bytes = 0;
  for (int i = 0; i < e.command_size(); ++i) {
    bytes += e.command(i).size();
    c.Require(e.command(i).find('\0') == std::string::npos,
              absl::StrCat("entrypoint.command[", i, "]"), "must not contain a NUL byte");
  }
  c.Require(bytes <= 64 * 1024, "entrypoint.command", "is longer than 64 KiB");
  c.Require(e.working_dir().empty() || e.working_dir()[0] == '/', "entrypoint.working_dir",
            absl::StrCat("must be an absolute path (got '", e.working_dir(), "')"));
  c.Require(e.working_dir().find('\0') == std::string::npos, "entrypoint.working_dir",
            "must not contain a NUL byte");
  c.Require(e.env_size() <= 1024, "entrypoint.env", "has more than 1024 variables");
  for (const auto& [name, value] : e.env()) {
    const std::string p = absl::StrCat("entrypoint.env[", name, "]");
    c.Require(EnvName(name), p, "is not a variable name ([A-Za-z_][A-Za-z0-9_]*)");
    c.Require(!absl::StartsWith(name, "PSCLUSTER_"), p,
              "PSCLUSTER_ variables are set by the worker (the task's contract)");
    c.Require(value.find('\0') == std::string::npos && value.size() <= 64 * 1024, p,
              "must be at most 64 KiB without NUL bytes");
  }
  const char* why = "describes the built-in trainer; a job with an entrypoint runs the user's "
                    "command instead (leave it out)";
  c.Require(!spec.has_model(), "model", why);
  c.Require(!spec.has_dataset(), "dataset", why);
  c.Require(spec.export_path().empty(), "export_path",
            "is written by the built-in trainer; an entrypoint's script exports its model "
            "itself (leave it out)");
  c.Require(spec.eval_batch_size() == 0, "eval_batch_size", why);
  c.Require(!spec.balance_data(), "balance_data",
            "is not supported with an entrypoint: the script, not the worker, reads the data");
  c.Require(!spec.allow_tf32(), "allow_tf32", why);
  c.Require(!spec.cuda_graphs(), "cuda_graphs", why);
  c.Require(spec.table_compression().empty(), "table_compression",
            "is applied by the built-in trainer's pushes; not supported with an entrypoint");
  c.Require(spec.table_embedding().empty(), "table_embedding",
            "is set by the built-in trainer when it creates tables; not supported with an "
            "entrypoint");
}

}  // namespace

absl::Status ValidateJobSpec(const v1::JobSpec& spec, const JobSource& where) {
  Checker c(where);
  c.Require(!spec.name().empty(), "name", "is required");
  c.Require(spec.name().size() <= 64 && NameChars(spec.name(), "_.-"), "name",
            absl::StrCat("must be 1-64 characters of A-Z a-z 0-9 _ . - (got '", spec.name(), "')"));
  const bool entrypoint = spec.has_entrypoint();
  if (entrypoint) {
    CheckEntrypoint(spec, c);
  } else {
    CheckModel(spec, c);
    CheckDataset(spec, c);
  }
  if (!spec.has_optimizer()) {
    c.Require(false, "optimizer", "is required (kind and learning_rate)");
  }
  CheckOptimizer(spec.optimizer(), "optimizer", c);
  for (const auto& [table, opt] : spec.table_optimizers()) {
    std::string p = absl::StrCat("table_optimizers[", table, "]");
    c.Require(ValidTableName(table), p, "is not a valid table name ([A-Za-z0-9_./-]{1,128})");
    CheckOptimizer(opt, p, c);
  }
  for (const auto& [table, cs] : spec.table_compression()) {
    std::string p = absl::StrCat("table_compression[", table, "]");
    c.Require(table == "*" || ValidTableName(table), p,
              "is not a valid table name ([A-Za-z0-9_./-]{1,128}) or \"*\" (every other table)");
    CheckCompression(cs, p, c);
  }
  for (const auto& [table, es] : spec.table_embedding()) {
    std::string p = absl::StrCat("table_embedding[", table, "]");
    // A name, or "layer/*" for every table under a layer (an embedding's one per field).
    const bool under = absl::EndsWith(table, "/*");
    c.Require(ValidTableName(under ? absl::string_view(table).substr(0, table.size() - 2)
                                   : absl::string_view(table)),
              p, "is not a valid table name ([A-Za-z0-9_./-]{1,128}, or a prefix and /*)");
    // The member checks the servers make (the table's kind is known only to the workers, who
    // refuse a name that is no sparse table).
    absl::Status es_ok = ValidateEmbedding(es, v1::SPARSE, p);
    if (!es_ok.ok()) RequireOk(es_ok, c);
    c.Require(!spec.consistency().aggregate() || !EmbeddingPolicy::Active(es),
              p, "admission and expiry are not supported with consistency.aggregate");
  }

  const v1::ConsistencySpec& cons = spec.consistency();
  c.Require(cons.mode() == v1::ConsistencySpec::SSP || cons.staleness() == 0,
            "consistency.staleness", "applies only to mode: ssp");
  c.Require(cons.staleness() <= 10000, "consistency.staleness", "must be at most 10000");
  c.Require(cons.mode() == v1::ConsistencySpec::BSP || !cons.aggregate(),
            "consistency.aggregate", "applies only to mode: bsp");

  c.Require(spec.num_servers() >= 1, "num_servers", "must be >= 1");
  c.Require(spec.num_servers() <= kMaxServers, "num_servers",
            absl::StrCat("must be at most ", kMaxServers));
  c.Require(spec.num_workers() >= 1, "num_workers", "must be >= 1");
  c.Require(spec.num_workers() <= kMaxWorkers, "num_workers",
            absl::StrCat("must be at most ", kMaxWorkers));
  c.Require(spec.min_workers() <= spec.num_workers(), "min_workers",
            absl::StrCat("must be at most num_workers (", spec.num_workers(), "); 0 = 1"));
  c.Require(spec.gpus_per_worker() <= kMaxGpusPerWorker, "gpus_per_worker",
            absl::StrCat("must be at most ", kMaxGpusPerWorker));
  // An entrypoint's script may read epochs and batch_size from its task file, or ignore them.
  c.Require((entrypoint && spec.epochs() == 0) || (spec.epochs() >= 1 && spec.epochs() <= 100000),
            "epochs", "must be in [1, 100000]");
  c.Require((entrypoint && spec.batch_size() == 0) ||
                (spec.batch_size() >= 1 && spec.batch_size() <= (1u << 20)),
            "batch_size", "must be in [1, 1048576]");
  c.Require(spec.eval_batch_size() <= (1u << 20), "eval_batch_size",
            "must be at most 1048576 (0 = 1000)");
  c.Require(spec.checkpoint_every_steps() == 0 || !spec.checkpoint_dir().empty(),
            "checkpoint_dir", "is required when checkpoint_every_steps > 0");
  uint32_t replication = spec.replication() == 0 ? 1 : spec.replication();
  c.Require(replication <= spec.num_servers() || spec.num_servers() == 0, "replication",
            absl::StrCat("must be at most num_servers (", spec.num_servers(),
                         "): each copy of a shard lives on a different server"));
  c.Require(spec.export_path().empty() || absl::EndsWith(spec.export_path(), ".safetensors"),
            "export_path", "must name a .safetensors file");
  uint32_t shards = spec.num_virtual_shards() == 0 ? kDefaultVirtualShards
                                                   : spec.num_virtual_shards();
  c.Require(shards <= kMaxVirtualShards, "num_virtual_shards",
            absl::StrCat("must be at most ", kMaxVirtualShards));
  c.Require(shards >= spec.num_servers(), "num_virtual_shards",
            absl::StrCat(shards, " virtual shards cannot be spread over num_servers ",
                         spec.num_servers(), " servers (need at least one shard each)"));
  const std::string& dev = spec.device();
  c.Require(dev.empty() || dev == "auto" || dev == "cuda" || dev == "cpu", "device",
            absl::StrCat("must be auto, cuda or cpu (got '", dev, "')"));
  c.Require(dev != "cuda" || spec.gpus_per_worker() > 0, "gpus_per_worker",
            "must be >= 1 when device is cuda");
  c.Require(dev != "cpu" || spec.gpus_per_worker() == 0, "gpus_per_worker",
            "must be 0 when device is cpu");
  c.Require(!spec.allow_tf32() || (dev != "cpu" && spec.gpus_per_worker() > 0), "allow_tf32",
            "applies to CUDA workers only: needs gpus_per_worker >= 1 and device cuda or auto");
  c.Require(!spec.cuda_graphs() || (dev != "cpu" && spec.gpus_per_worker() > 0), "cuda_graphs",
            "applies to CUDA workers only: needs gpus_per_worker >= 1 and device cuda or auto");
  return c.status();
}

void ApplyJobDefaults(v1::JobSpec* spec) {
  if (spec->num_virtual_shards() == 0) spec->set_num_virtual_shards(kDefaultVirtualShards);
  if (spec->replication() == 0) spec->set_replication(1);
  if (spec->device().empty()) spec->set_device("auto");
}

}  // namespace pscluster::scheduler
