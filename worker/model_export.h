// The model as the servers hold it at a clock, written as a safetensors file: dense parameters
// by their shape, sparse ones as `NAME.keys` (uint64) and `NAME` (rows x width) over the keys
// given, or over the keys the servers hold rows for (ExportListed).
#ifndef PSCLUSTER_WORKER_MODEL_EXPORT_H_
#define PSCLUSTER_WORKER_MODEL_EXPORT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/models/model.h"
#include "common/file_system.h"
#include "server/client/param_client.h"
#include "worker/param_slots.h"

namespace pscluster::worker {

// Checks that `export_path` lies in `root` (a resolved --export_root; empty = anywhere), creates
// its directory and checks it is writable (a lead rank checks this when its task starts, not
// after hours of training). Errors name `field`. The root check resolves paths on the machine's
// file system; the directory is made and probed through `fs`.
absl::Status ExportDirReady(const std::string& export_path, const std::string& root = "",
                            absl::string_view field = "export_path",
                            FileSystem* fs = FileSystem::Default());

// Pulls every parameter at `clock` (the sparse ones at `sparse_keys`, sorted and unique) into
// `slot` and writes them to `path` with `metadata`. Returns the bytes written; errors name
// export_path. The file is written through `fs` (atomically: a crash leaves the old file or the
// new one, whole).
absl::StatusOr<uint64_t> ExportModel(const kernels::Model& model, kernels::Backend* backend,
                                     ParamClient* client, int64_t clock,
                                     const std::vector<uint64_t>& sparse_keys,
                                     const std::string& path,
                                     const std::map<std::string, std::string>& metadata,
                                     ParamSlot* slot, FileSystem* fs = FileSystem::Default());

// The same file as ExportModel from `params` alone, into host memory (no backend, no slot): what
// an on-demand export runs on a thread of its own while the task trains (psctl export).
absl::StatusOr<uint64_t> ExportParams(const std::vector<kernels::ParamInfo>& params,
                                      ParamClient* client, int64_t clock,
                                      const std::vector<uint64_t>& sparse_keys,
                                      const std::string& path,
                                      const std::map<std::string, std::string>& metadata,
                                      FileSystem* fs = FileSystem::Default());

// The keys one sparse table may list for an export (their 8 bytes each are held while it
// writes).
inline constexpr uint64_t kMaxListedKeys = uint64_t{1} << 27;

// Writes every parameter at `clock` to `path` with `metadata`, each sparse one at the keys its
// servers hold a row for (ParamClient::ListKeys, listed first; a key never pushed, or not
// admitted, has no row and is not written): what a model over the user's keys (kind graph)
// exports. Streams: the file is written as the values arrive, a dense table or `rows_per_pull`
// rows at a time, so memory follows the largest dense table and the keys, not the model.
// Errors name `field` (export_path, or path for an export on demand); crash-safe as ExportModel.
absl::StatusOr<uint64_t> ExportListed(const std::vector<kernels::ParamInfo>& params,
                                      ParamClient* client, int64_t clock, const std::string& path,
                                      const std::map<std::string, std::string>& metadata,
                                      FileSystem* fs = FileSystem::Default(),
                                      absl::string_view field = "export_path",
                                      size_t rows_per_pull = 65536);

}  // namespace pscluster::worker

#endif  // PSCLUSTER_WORKER_MODEL_EXPORT_H_
