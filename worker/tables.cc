#include "worker/tables.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pscluster::worker {

absl::StatusOr<std::vector<v1::TableSpec>> TableSpecsFor(const kernels::Model& model,
                                                         const v1::JobSpec& spec,
                                                         int64_t total_steps) {
  absl::flat_hash_set<std::string> names;
  for (const auto& p : model.params()) names.insert(p.name);
  for (const auto& [name, unused] : spec.table_optimizers()) {
    if (!names.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table_optimizers: '", name, "' is not a parameter of the ", model.kind(), " model"));
    }
  }
  for (const auto& [name, unused] : spec.table_compression()) {
    if (name != "*" && !names.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table_compression: '", name, "' is not a parameter of the ", model.kind(), " model"));
    }
  }
  // table_embedding: a table's own entry, else the "prefix/*" entry that covers it.
  auto embedding_of = [&](const std::string& name) -> const v1::EmbeddingSpec* {
    auto it = spec.table_embedding().find(name);
    if (it != spec.table_embedding().end()) return &it->second;
    for (size_t slash = name.rfind('/'); slash != std::string::npos && slash > 0;
         slash = name.rfind('/', slash - 1)) {
      it = spec.table_embedding().find(name.substr(0, slash) + "/*");
      if (it != spec.table_embedding().end()) return &it->second;
    }
    return nullptr;
  };
  for (const auto& [name, unused] : spec.table_embedding()) {
    const bool under = absl::EndsWith(name, "/*");
    const std::string prefix = under ? name.substr(0, name.size() - 1) : "";
    bool matched = false;
    for (const auto& p : model.params()) {
      if (under ? !absl::StartsWith(p.name, prefix) : p.name != name) continue;
      if (!p.sparse) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table_embedding: '", p.name, "' is a dense parameter of the ", model.kind(),
            " model; admission and expiry apply to sparse (embedding) tables"));
      }
      matched = true;
    }
    if (!matched) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table_embedding: '", name, "' names no parameter of the ", model.kind(), " model"));
    }
  }
  std::vector<v1::TableSpec> out;
  for (const kernels::ParamInfo& p : model.params()) {
    v1::TableSpec t;
    t.set_name(p.name);
    t.set_dtype(v1::DT_FLOAT32);
    if (p.sparse) {
      t.set_kind(v1::SPARSE);
      t.set_row_width(static_cast<uint32_t>(p.row_width));
      t.set_key_space(p.key_space);
    } else {
      t.set_kind(v1::DENSE);
      for (int64_t d : p.shape) t.mutable_shape()->add_dims(static_cast<uint64_t>(d));
    }
    *t.mutable_init() = p.init;
    auto opt = spec.table_optimizers().find(p.name);
    *t.mutable_optimizer() = opt != spec.table_optimizers().end() ? opt->second : spec.optimizer();
    if (t.optimizer().lr_schedule() == v1::OptimizerSpec::COSINE &&
        t.optimizer().lr_decay_steps() == 0) {
      t.mutable_optimizer()->set_lr_decay_steps(static_cast<uint64_t>(total_steps));
    }
    // The table's own entry, else "*" (whose top-k / int8 / pull top-k applies to dense tables
    // only).
    auto comp = spec.table_compression().find(p.name);
    if (comp != spec.table_compression().end()) {
      *t.mutable_compression() = comp->second;
    } else if (comp = spec.table_compression().find("*"); comp != spec.table_compression().end()) {
      *t.mutable_compression() = comp->second;
      if (p.sparse) {
        t.mutable_compression()->clear_topk_ratio();
        t.mutable_compression()->clear_quantize();
        t.mutable_compression()->clear_pull_topk_ratio();
      }
    }
    if (const v1::EmbeddingSpec* e = embedding_of(p.name); e != nullptr && p.sparse) {
      *t.mutable_embedding() = *e;
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace pscluster::worker
