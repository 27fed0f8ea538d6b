#include "server/validate.h"

#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/compression_spec.h"
#include "common/dtype.h"
#include "common/grad_compress.h"
#include "common/sharding.h"
#include "server/embedding_policy.h"
#include "server/initializer.h"

namespace pscluster {
namespace {

bool IsNameChar(char c, bool allow_slash) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-' || (allow_slash && c == '/');
}

bool IsValidTableName(absl::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    if (!IsNameChar(c, true)) return false;
  }
  return true;
}

absl::Status ValidateTable(v1::TableSpec* t, absl::string_view f) {
  auto bad = [&](absl::string_view member, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(f, ".", member, ": ", why));
  };
  if (!IsValidTableName(t->name())) {
    return bad("name", absl::StrCat("'", t->name(), "' must match [A-Za-z0-9_./-]{1,128}"));
  }
  if (t->dtype() != v1::DT_INVALID && t->dtype() != v1::DT_FLOAT32) {
    return bad("dtype", absl::StrCat("tables are stored as float32 (DT_FLOAT32), not ",
                                     v1::DataType_Name(t->dtype())));
  }
  t->set_dtype(v1::DT_FLOAT32);
  if (t->kind() == v1::DENSE) {
    unsigned __int128 elems = 1;
    for (int i = 0; i < t->shape().dims_size(); ++i) {
      if (t->shape().dims(i) == 0) {
        return bad(absl::StrCat("shape.dims[", i, "]"), "every dimension must be > 0");
      }
      elems *= t->shape().dims(i);
      if (elems > kMaxTableElems) {
        return bad("shape", absl::StrCat("more than ", kMaxTableElems, " (2^42) elements"));
      }
    }
    if (t->block_elems() == 0) t->set_block_elems(kDefaultBlockElems);
    if (t->block_elems() > kMaxBlockElems) {
      return bad("block_elems", absl::StrCat(t->block_elems(), " exceeds ", kMaxBlockElems,
                                             " (a block must fit one 4 MiB chunk)"));
    }
    const uint64_t blocks = static_cast<uint64_t>((elems + t->block_elems() - 1) / t->block_elems());
    if (blocks > kMaxBlocks) {
      return bad("block_elems", absl::StrCat(static_cast<uint64_t>(elems), " elements in blocks of ",
                                             t->block_elems(), " make ", blocks,
                                             " blocks; at most ", kMaxBlocks,
                                             " per table (use larger blocks)"));
    }
    if (t->row_width() != 0 || t->key_space() != 0) {
      return bad("row_width", "row_width and key_space are for sparse tables");
    }
  } else if (t->kind() == v1::SPARSE) {
    if (t->row_width() == 0 || t->row_width() > kMaxRowWidth) {
      return bad("row_width", absl::StrCat("must be in [1, ", kMaxRowWidth, "], got ",
                                           t->row_width()));
    }
    if (t->shape().dims_size() != 0 || t->block_elems() != 0) {
      return bad("shape", "shape and block_elems are for dense tables");
    }
  } else {
    return bad("kind", "must be DENSE or SPARSE");
  }
  absl::Status s = ValidateInitializer(*t, absl::StrCat(f, ".init"));
  if (!s.ok()) return s;
  const auto transport = t->compression().transport();
  if (transport != v1::DT_INVALID && transport != v1::DT_FLOAT32 && transport != v1::DT_FLOAT16 &&
      transport != v1::DT_BFLOAT16) {
    return bad("compression.transport", "must be DT_FLOAT32, DT_FLOAT16 or DT_BFLOAT16");
  }
  s = CheckGradientCompression(*t, f);
  if (!s.ok()) return s;
  return ValidateEmbedding(t->embedding(), t->kind(), absl::StrCat(f, ".embedding"));
}

}  // namespace

bool IsValidJobId(absl::string_view id) {
  if (id.empty() || id.size() > 128 || id == "." || id == "..") return false;
  for (char c : id) {
    if (!IsNameChar(c, false)) return false;
  }
  return true;
}

absl::Status ValidateCreateTables(const v1::CreateTablesRequest& req,
                                  std::vector<v1::TableSpec>* specs,
                                  std::vector<OptimizerParams>* optimizers) {
  if (!IsValidJobId(req.job_id())) {
    return absl::InvalidArgumentError(
        absl::StrCat("job_id: '", req.job_id(), "' must match [A-Za-z0-9_.-]{1,128}"));
  }
  if (req.num_workers() == 0 || req.num_workers() > kMaxWorkers) {
    return absl::InvalidArgumentError(absl::StrCat("num_workers: must be in [1, ", kMaxWorkers,
                                                   "], got ", req.num_workers()));
  }
  if (req.num_virtual_shards() > kMaxVirtualShards) {
    return absl::InvalidArgumentError(absl::StrCat("num_virtual_shards: at most ",
                                                   kMaxVirtualShards));
  }
  const auto& c = req.consistency();
  if (!v1::ConsistencySpec::Mode_IsValid(c.mode())) {
    return absl::InvalidArgumentError("consistency.mode: must be BSP, SSP or ASP");
  }
  if (c.aggregate() && c.mode() != v1::ConsistencySpec::BSP) {
    return absl::InvalidArgumentError(
        "consistency.aggregate: synchronous aggregation needs mode BSP");
  }
  std::set<std::string> names;
  specs->clear();
  optimizers->clear();
  for (int i = 0; i < req.tables_size(); ++i) {
    const std::string f = absl::StrCat("tables[", i, "]");
    v1::TableSpec t = req.tables(i);
    absl::Status s = ValidateTable(&t, f);
    if (!s.ok()) return s;
    if (c.aggregate() && EmbeddingPolicy::Active(t.embedding())) {
      return absl::InvalidArgumentError(absl::StrCat(
          f, ".embedding: admission and expiry are not supported with consistency.aggregate "
             "(table '", t.name(), "')"));
    }
    if (!names.insert(t.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(f, ".name: '", t.name(),
                                                     "' is declared twice"));
    }
    auto opt = ResolveOptimizer(t.optimizer(), absl::StrCat(f, ".optimizer"));
    if (!opt.ok()) return opt.status();
    specs->push_back(std::move(t));
    optimizers->push_back(*opt);
  }
  return absl::OkStatus();
}

absl::Status ValidateShardMap(const v1::ShardMap& map, absl::string_view field) {
  if (!IsValidJobId(map.job_id())) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".job_id: '", map.job_id(),
                                                   "' is not a valid job id"));
  }
  if (map.num_virtual_shards() == 0 || map.num_virtual_shards() > kMaxVirtualShards) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".num_virtual_shards: must be in [1, ",
                                                   kMaxVirtualShards, "]"));
  }
  if (static_cast<uint32_t>(map.assignments_size()) != map.num_virtual_shards()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".assignments: ", map.assignments_size(), " assignments for ",
        map.num_virtual_shards(), " virtual shards (need exactly one each)"));
  }
  for (int i = 0; i < map.assignments_size(); ++i) {
    if (map.assignments(i).shard() != static_cast<uint32_t>(i)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".assignments[", i, "].shard: is ",
                                                     map.assignments(i).shard(), ", expected ", i,
                                                     " (ordered by shard)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckStep(int64_t v, absl::string_view field) {
  constexpr int64_t kMaxStep = int64_t{1} << 62;
  if (v < 0) return absl::InvalidArgumentError(absl::StrCat(field, ": ", v, " is negative"));
  if (v > kMaxStep) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", v, " is beyond the largest step, ", kMaxStep, " (2^62)"));
  }
  return absl::OkStatus();
}

bool IsFloatTransport(v1::DataType t) {
  return t == v1::DT_FLOAT32 || t == v1::DT_FLOAT16 || t == v1::DT_BFLOAT16;
}

absl::Status ValidatePushTag(const v1::PushChunk& chunk, absl::string_view job_id,
                             uint32_t num_workers) {
  const v1::Tag& tag = chunk.tag();
  if (tag.worker() >= num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("tag.worker: rank ", tag.worker(),
                                                   " is outside job '", job_id, "' (",
                                                   num_workers, " workers)"));
  }
  return CheckStep(tag.step(), "tag.step");
}

absl::Status ValidatePushEncoding(const v1::PushChunk& chunk, uint64_t values_bytes,
                                  uint64_t max_chunk_bytes) {
  const v1::DataType dtype = chunk.dtype() == v1::DT_INVALID ? v1::DT_FLOAT32 : chunk.dtype();
  if (!IsFloatTransport(dtype) && dtype != v1::DT_INT8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype: values must be float32, float16, bfloat16 or int8, got ",
        std::string(DTypeName(dtype)), " (", static_cast<int>(chunk.dtype()), ")"));
  }
  if (values_bytes > max_chunk_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "values: ", values_bytes, " bytes exceed the limit of ", max_chunk_bytes,
        " bytes per chunk; split tensors into chunks of about 4 MiB"));
  }
  if (dtype == v1::DT_INT8) {
    if (!chunk.slice().keys().empty()) {
      return absl::InvalidArgumentError("dtype: int8 pushes apply to dense blocks only");
    }
    const uint32_t group = chunk.scale_group();
    if (group == 0) {
      return absl::InvalidArgumentError("scale_group: an int8 push needs scales per group (> 0)");
    }
    if (chunk.scales().size() != 4 * NumScaleGroups(values_bytes, group)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "scales: ", chunk.scales().size(), " bytes do not hold one float32 per group of ",
          group, " of the ", values_bytes, " int8 values"));
    }
    for (size_t g = 0; g < chunk.scales().size() / 4; ++g) {
      float scale;
      std::memcpy(&scale, chunk.scales().data() + 4 * g, 4);
      if (!std::isfinite(scale) || scale < 0) {
        return absl::InvalidArgumentError(absl::StrCat("scales: group ", g, "'s scale ", scale,
                                                       " is not a finite number >= 0"));
      }
    }
  } else if (!chunk.scales().empty() || chunk.scale_group() != 0) {
    return absl::InvalidArgumentError("scales: set only on int8 pushes");
  }
  if (chunk.pull_after()) {
    absl::Status st = CheckStep(chunk.pull_clock(), "pull_clock");
    if (!st.ok()) return st;
  }
  if (chunk.slice().table().empty() &&
      (values_bytes > 0 || !chunk.indices().empty() || chunk.pull_after())) {
    return absl::InvalidArgumentError("slice.table: values or pull_after without a table");
  }
  return absl::OkStatus();
}

absl::Status ValidatePushExtent(const v1::PushChunk& chunk, const PushTarget& target,
                                v1::DataType dtype, uint64_t values_bytes, uint64_t* n) {
  const size_t es = DTypeSize(dtype);
  if (values_bytes % es != 0) {
    return absl::InvalidArgumentError(absl::StrCat("values: ", values_bytes,
                                                   " bytes is not a whole number of ",
                                                   std::string(DTypeName(dtype)), " elements"));
  }
  *n = values_bytes / es;
  if (!chunk.indices().empty()) {
    if (!target.dense) {
      return absl::InvalidArgumentError(
          "indices: top-k indices apply to dense blocks; sparse pushes list their rows in keys");
    }
    if (chunk.indices().size() % 4 != 0 || chunk.indices().size() / 4 != *n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "indices: ", chunk.indices().size(), " bytes do not hold one uint32 per value (", *n,
          " values)"));
    }
    if (chunk.offset() != 0) return absl::InvalidArgumentError("offset: must be 0 for a top-k push");
    for (uint64_t i = 0; i < *n; ++i) {
      uint32_t idx;
      std::memcpy(&idx, chunk.indices().data() + 4 * i, 4);
      if (idx >= target.elems) {
        return absl::InvalidArgumentError(absl::StrCat("indices: index ", idx,
                                                       " is outside block ", target.block, " (",
                                                       target.elems, " elements)"));
      }
    }
    return absl::OkStatus();
  }
  if (chunk.offset() > target.elems || *n > target.elems - chunk.offset()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "values: ", *n, " elements at offset ", chunk.offset(), " overrun the slice of '",
        chunk.slice().table(), "' (", target.elems, " elements)"));
  }
  if (chunk.offset() % target.width != 0 || *n % target.width != 0) {
    return absl::InvalidArgumentError(absl::StrCat("values: offset ", chunk.offset(), " and ", *n,
                                                   " elements must be whole rows of width ",
                                                   target.width));
  }
  return absl::OkStatus();
}

}  // namespace pscluster
