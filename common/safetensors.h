// The safetensors file format (as written by huggingface/safetensors): an 8-byte little-endian
// header length N, N bytes of JSON mapping each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end]} (offsets relative to the data section) plus an optional
// "__metadata__" object of strings, then the raw little-endian tensor bytes.
//
// Used by servers to export the dense tables they hold and by workers to write whole models.
// The reader validates everything (header bounds, JSON, dtypes, shapes against byte lengths,
// offsets inside the file, no overlaps, no gaps) and names the file and tensor at fault.
#ifndef PSCLUSTER_COMMON_SAFETENSORS_H_
#define PSCLUSTER_COMMON_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/atomic_file.h"
#include "common/file_system.h"
#include "proto/common.pb.h"

namespace pscluster {

// One tensor to write. `data` must hold product(shape) * DTypeSize(dtype) bytes.
struct SafetensorsTensor {
  std::string name;
  v1::DataType dtype = v1::DT_FLOAT32;
  std::vector<uint64_t> shape;
  absl::string_view data;
};

// The format's dtype names ("F32", "F16", "BF16", "F64", "I32", "I64", "U64"); empty for types
// the format cannot express here.
absl::string_view SafetensorsDTypeName(v1::DataType dtype);

// Serialises tensors (in the given order) and metadata into one buffer. INVALID_ARGUMENT names
// the tensor whose name, dtype or byte length is wrong, or a duplicated name.
absl::StatusOr<std::string> EncodeSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                              const std::map<std::string, std::string>& metadata = {});

// EncodeSafetensors, then WriteFileAtomically on `fs`. Returns the file size.
absl::StatusOr<uint64_t> WriteSafetensors(const std::string& path,
                                          const std::vector<SafetensorsTensor>& tensors,
                                          const std::map<std::string, std::string>& metadata = {},
                                          FileSystem* fs = FileSystem::Default());

// A safetensors file written as its tensors' bytes come (a model larger than one buffer): the
// entries (names, dtypes, shapes) are declared first, then their bytes appended in that order in
// as many pieces as wanted, then Finish. Crash-safe as WriteFileAtomically: the file appears
// whole at Finish or not at all (a writer destroyed unfinished leaves the old file).
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    v1::DataType dtype = v1::DT_FLOAT32;
    std::vector<uint64_t> shape;
  };
  // INVALID_ARGUMENT names the entry with a bad name, dtype or shape, or a duplicated name.
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, const std::vector<Entry>& entries,
      const std::map<std::string, std::string>& metadata = {},
      FileSystem* fs = FileSystem::Default());
  // INVALID_ARGUMENT past the declared bytes.
  absl::Status Append(absl::string_view bytes);
  // FAILED_PRECONDITION while declared bytes are missing. Returns the file's size.
  absl::StatusOr<uint64_t> Finish();

 private:
  SafetensorsWriter() = default;
  std::string path_;
  std::unique_ptr<AtomicFileWriter> file_;
  uint64_t remaining_ = 0;
  uint64_t written_ = 0;
};

// A parsed safetensors file; owns its bytes.
class SafetensorsFile {
 public:
  struct Entry {
    std::string name;
    v1::DataType dtype = v1::DT_INVALID;
    std::vector<uint64_t> shape;
    uint64_t begin = 0;  // Offsets into the data section.
    uint64_t end = 0;
  };

  // Validates `bytes`; `source` (a file name) prefixes every error message.
  static absl::StatusOr<SafetensorsFile> Parse(std::string bytes, absl::string_view source);
  static absl::StatusOr<SafetensorsFile> Read(const std::string& path);

  // Entries in data-offset order.
  const std::vector<Entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const Entry* Find(absl::string_view name) const;
  absl::string_view Data(const Entry& e) const {
    return absl::string_view(bytes_.data() + data_start_ + e.begin, e.end - e.begin);
  }

 private:
  std::string bytes_;
  uint64_t data_start_ = 0;
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_SAFETENSORS_H_
