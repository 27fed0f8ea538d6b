#include "worker/data/fashion_mnist.h"

#include <zlib.h>

#include <cmath>

#include "absl/strings/str_cat.h"

namespace pscluster::data {
namespace {

constexpr char kPackageHint[] =
    " (install Debian's dataset-fashion-mnist package: deploy/install_deps.sh)";

absl::StatusOr<std::string> ReadGz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, kPackageHint));
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    int n = gzread(f, buf, sizeof(buf));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      return absl::DataLossError(absl::StrCat(path, ": corrupt gzip data: ", msg));
    }
    if (n == 0) break;
    out.append(buf, n);
  }
  gzclose(f);
  return out;
}

uint32_t BigEndian32(const std::string& s, size_t off) {
  return (uint32_t{static_cast<uint8_t>(s[off])} << 24) |
         (uint32_t{static_cast<uint8_t>(s[off + 1])} << 16) |
         (uint32_t{static_cast<uint8_t>(s[off + 2])} << 8) | uint32_t{static_cast<uint8_t>(s[off + 3])};
}

absl::StatusOr<DenseDataset> LoadSplit(const std::string& dir, const std::string& prefix) {
  std::string img_path = absl::StrCat(dir, "/", prefix, "-images-idx3-ubyte.gz");
  std::string lbl_path = absl::StrCat(dir, "/", prefix, "-labels-idx1-ubyte.gz");
  auto images = ReadIdx(img_path);
  if (!images.ok()) return images.status();
  auto labels = ReadIdx(lbl_path);
  if (!labels.ok()) return labels.status();
  if (images->dims.size() != 3) {
    return absl::DataLossError(absl::StrCat(img_path, ": expected 3 dimensions, found ",
                                            images->dims.size()));
  }
  if (labels->dims.size() != 1) {
    return absl::DataLossError(absl::StrCat(lbl_path, ": expected 1 dimension, found ",
                                            labels->dims.size()));
  }
  if (images->dims[0] != labels->dims[0]) {
    return absl::DataLossError(absl::StrCat(img_path, " has ", images->dims[0], " images but ",
                                            lbl_path, " has ", labels->dims[0], " labels"));
  }
  DenseDataset ds;
  ds.n = images->dims[0];
  ds.dim = int64_t{images->dims[1]} * images->dims[2];
  ds.num_classes = 10;
  ds.x.resize(static_cast<size_t>(ds.n * ds.dim));
  for (size_t i = 0; i < ds.x.size(); ++i) {
    ds.x[i] = static_cast<uint8_t>(images->data[i]) / 255.0f;
  }
  ds.y.resize(ds.n);
  for (int64_t i = 0; i < ds.n; ++i) {
    uint8_t l = static_cast<uint8_t>(labels->data[i]);
    if (l >= 10) {
      return absl::DataLossError(absl::StrCat(lbl_path, ": label ", int{l}, " of example ", i,
                                              " is not in [0, 10)"));
    }
    ds.y[i] = l;
  }
  return ds;
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdx(const std::string& path) {
  auto raw = ReadGz(path);  // gzread also reads uncompressed files transparently.
  if (!raw.ok()) return raw.status();
  const std::string& s = *raw;
  if (s.size() < 4 || s[0] != 0 || s[1] != 0) {
    return absl::DataLossError(absl::StrCat(path, ": not an IDX file (bad magic)"));
  }
  if (static_cast<uint8_t>(s[2]) != 0x08) {
    return absl::DataLossError(absl::StrCat(path, ": IDX element type ",
                                            int{static_cast<uint8_t>(s[2])},
                                            " is not unsigned byte (0x08)"));
  }
  int ndims = static_cast<uint8_t>(s[3]);
  if (ndims < 1 || ndims > 4 || s.size() < 4 + 4 * static_cast<size_t>(ndims)) {
    return absl::DataLossError(absl::StrCat(path, ": IDX header is truncated or has ", ndims,
                                            " dimensions"));
  }
  IdxArray out;
  uint64_t total = 1;
  for (int d = 0; d < ndims; ++d) {
    uint32_t dim = BigEndian32(s, 4 + 4 * d);
    if (dim == 0 || dim > (1u << 28)) {
      return absl::DataLossError(absl::StrCat(path, ": dimension ", d, " has size ", dim));
    }
    out.dims.push_back(dim);
    total *= dim;
  }
  size_t header = 4 + 4 * static_cast<size_t>(ndims);
  if (s.size() - header != total) {
    return absl::DataLossError(absl::StrCat(path, ": expected ", total, " bytes of data, found ",
                                            s.size() - header, " (truncated or corrupt file)"));
  }
  out.data = s.substr(header);
  return out;
}

absl::StatusOr<FashionMnist> LoadFashionMnist(const std::string& dir_in) {
  std::string dir = dir_in.empty() ? kFashionMnistDefaultDir : dir_in;
  FashionMnist out;
  auto train = LoadSplit(dir, "train");
  if (!train.ok()) return train.status();
  auto test = LoadSplit(dir, "t10k");
  if (!test.ok()) return test.status();
  out.train = std::move(*train);
  out.test = std::move(*test);
  if (out.train.dim != out.test.dim) {
    return absl::DataLossError(absl::StrCat(dir, ": train images have ", out.train.dim,
                                            " pixels but test images have ", out.test.dim));
  }
  // Standardise with the training set's statistics.
  double sum = 0, sq = 0;
  for (float v : out.train.x) {
    sum += v;
    sq += double{v} * v;
  }
  double mean = sum / out.train.x.size();
  double stddev = std::sqrt(std::max(1e-12, sq / out.train.x.size() - mean * mean));
  for (DenseDataset* ds : {&out.train, &out.test}) {
    for (float& v : ds->x) v = static_cast<float>((v - mean) / stddev);
  }
  return out;
}

}  // namespace pscluster::data
