#include "worker/model_export.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/atomic_file.h"
#include "common/path_root.h"
#include "common/safetensors.h"

namespace pscluster::worker {

absl::Status ExportDirReady(const std::string& path, const std::string& root,
                            absl::string_view field, FileSystem* fs) {
  absl::Status in_root = CheckUnderRoot(path, root, field);
  if (!in_root.ok()) return in_root;
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  absl::Status ds = fs->MakeDirs(dir);
  if (ds.ok()) {
    std::string probe = absl::StrCat(path, ".probe");
    ds = WriteFileAtomically(fs, probe, "");
    (void)fs->Remove(probe);
  }
  if (!ds.ok()) return absl::Status(ds.code(), absl::StrCat(field, ": ", ds.message()));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ExportModel(const kernels::Model& model, kernels::Backend* backend,
                                     ParamClient* client, int64_t clock,
                                     const std::vector<uint64_t>& sparse_keys,
                                     const std::string& path,
                                     const std::map<std::string, std::string>& metadata,
                                     ParamSlot* slot, FileSystem* fs) {
  const auto& params = model.params();
  std::vector<std::vector<uint64_t>> keys(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].sparse) keys[i] = sparse_keys;
  }
  absl::Status ps = PrepareSlot(model, backend, std::move(keys), slot);
  PullTargets targets = TargetsOf(model, slot, true, true);
  targets.exact = true;  // The servers' weights, not a worker's copy that may lag them.
  if (ps.ok()) ps = client->Pull(clock, targets);
  if (!ps.ok()) return ps;
  std::vector<SafetensorsTensor> tensors;
  for (size_t i = 0; i < params.size(); ++i) {
    const kernels::ParamInfo& p = params[i];
    absl::string_view bytes(reinterpret_cast<const char*>(slot->values[i].data()),
                            slot->values[i].size() * sizeof(float));
    if (p.sparse) {
      tensors.push_back({p.name + ".keys", v1::DT_UINT64, {slot->keys[i].size()},
                         absl::string_view(reinterpret_cast<const char*>(slot->keys[i].data()),
                                           slot->keys[i].size() * sizeof(uint64_t))});
      tensors.push_back({p.name, v1::DT_FLOAT32,
                         {slot->keys[i].size(), static_cast<uint64_t>(p.row_width)}, bytes});
    } else {
      std::vector<uint64_t> shape(p.shape.begin(), p.shape.end());
      tensors.push_back({p.name, v1::DT_FLOAT32, shape, bytes});
    }
  }
  auto written = WriteSafetensors(path, tensors, metadata, fs);
  if (!written.ok()) {
    return absl::Status(written.status().code(),
                        absl::StrCat("export_path: ", written.status().message()));
  }
  return static_cast<uint64_t>(*written);
}

absl::StatusOr<uint64_t> ExportParams(const std::vector<kernels::ParamInfo>& params,
                                      ParamClient* client, int64_t clock,
                                      const std::vector<uint64_t>& sparse_keys,
                                      const std::string& path,
                                      const std::map<std::string, std::string>& metadata,
                                      FileSystem* fs) {
  std::vector<std::vector<float>> values(params.size());
  PullTargets targets;
  for (size_t i = 0; i < params.size(); ++i) {
    const kernels::ParamInfo& p = params[i];
    if (p.sparse) {
      values[i].resize(sparse_keys.size() * static_cast<size_t>(p.row_width));
      targets.sparse.push_back({p.name, sparse_keys, values[i].data()});
    } else {
      values[i].resize(static_cast<size_t>(p.num_elements()));
      targets.dense.push_back({p.name, values[i].data()});
    }
  }
  targets.exact = true;
  absl::Status ps = client->Pull(clock, targets);
  if (!ps.ok()) return ps;
  std::vector<SafetensorsTensor> tensors;
  for (size_t i = 0; i < params.size(); ++i) {
    const kernels::ParamInfo& p = params[i];
    absl::string_view bytes(reinterpret_cast<const char*>(values[i].data()),
                            values[i].size() * sizeof(float));
    if (p.sparse) {
      tensors.push_back({p.name + ".keys", v1::DT_UINT64, {sparse_keys.size()},
                         absl::string_view(reinterpret_cast<const char*>(sparse_keys.data()),
                                           sparse_keys.size() * sizeof(uint64_t))});
      tensors.push_back({p.name, v1::DT_FLOAT32,
                         {sparse_keys.size(), static_cast<uint64_t>(p.row_width)}, bytes});
    } else {
      std::vector<uint64_t> shape(p.shape.begin(), p.shape.end());
      tensors.push_back({p.name, v1::DT_FLOAT32, shape, bytes});
    }
  }
  auto written = WriteSafetensors(path, tensors, metadata, fs);
  if (!written.ok()) {
    return absl::Status(written.status().code(),
                        absl::StrCat("path: ", written.status().message()));
  }
  return static_cast<uint64_t>(*written);
}

absl::StatusOr<uint64_t> ExportListed(const std::vector<kernels::ParamInfo>& params,
                                      ParamClient* client, int64_t clock, const std::string& path,
                                      const std::map<std::string, std::string>& metadata,
                                      FileSystem* fs, absl::string_view field,
                                      size_t rows_per_pull) {
  auto named = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(field, ": ", s.message()));
  };
  rows_per_pull = std::max<size_t>(1, rows_per_pull);
  // 1. The keys of every sparse table, so that the header can give every tensor's shape.
  std::vector<std::vector<uint64_t>> keys(params.size());
  std::vector<SafetensorsWriter::Entry> entries;
  for (size_t i = 0; i < params.size(); ++i) {
    const kernels::ParamInfo& p = params[i];
    if (!p.sparse) {
      entries.push_back({p.name, v1::DT_FLOAT32, {p.shape.begin(), p.shape.end()}});
      continue;
    }
    auto listed = client->ListKeys(p.name, kMaxListedKeys);
    if (!listed.ok()) return named(listed.status());
    keys[i] = std::move(*listed);
    entries.push_back({p.name + ".keys", v1::DT_UINT64, {keys[i].size()}});
    entries.push_back(
        {p.name, v1::DT_FLOAT32, {keys[i].size(), static_cast<uint64_t>(p.row_width)}});
  }
  auto writer = SafetensorsWriter::Create(path, entries, metadata, fs);
  if (!writer.ok()) return named(writer.status());
  // 2. The values in the header's order, pulled at `clock` a table or a batch of rows at a time.
  std::vector<float> values;
  for (size_t i = 0; i < params.size(); ++i) {
    const kernels::ParamInfo& p = params[i];
    absl::Status s;
    if (!p.sparse) {
      values.resize(static_cast<size_t>(p.num_elements()));
      PullTargets targets;
      targets.dense.push_back({p.name, values.data()});
      targets.exact = true;
      s = client->Pull(clock, targets);
      if (!s.ok()) return s;
      s = (*writer)->Append(absl::string_view(reinterpret_cast<const char*>(values.data()),
                                              values.size() * sizeof(float)));
      if (!s.ok()) return named(s);
      continue;
    }
    const std::vector<uint64_t>& k = keys[i];
    s = (*writer)->Append(
        absl::string_view(reinterpret_cast<const char*>(k.data()), k.size() * sizeof(uint64_t)));
    if (!s.ok()) return named(s);
    const size_t width = static_cast<size_t>(p.row_width);
    for (size_t at = 0; at < k.size(); at += rows_per_pull) {
      const size_t n = std::min(rows_per_pull, k.size() - at);
      values.resize(n * width);
      PullTargets targets;
      targets.sparse.push_back({p.name, absl::MakeConstSpan(k.data() + at, n), values.data()});
      s = client->Pull(clock, targets);
      if (!s.ok()) return s;
      s = (*writer)->Append(absl::string_view(reinterpret_cast<const char*>(values.data()),
                                              values.size() * sizeof(float)));
      if (!s.ok()) return named(s);
    }
  }
  auto written = (*writer)->Finish();
  if (!written.ok()) return named(written.status());
  return *written;
}

}  // namespace pscluster::worker
