#include "kernels/models/model.h"

#include "absl/strings/str_cat.h"

namespace pscluster::kernels {

int64_t ParamInfo::num_elements() const {
  if (sparse) return row_width;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::Status ValidateParamLayout(const std::vector<ParamInfo>& params, const ParamValues& p,
                                 const Gradients* g) {
  const size_t count = params.size();
  if (p.values.size() != count) {
    return absl::InvalidArgumentError(absl::StrCat("params.values has ", p.values.size(), " entries, want ", count));
  }
  if (g != nullptr && g->values.size() != count) {
    return absl::InvalidArgumentError(absl::StrCat("grads.values has ", g->values.size(), " entries, want ", count));
  }
  for (size_t i = 0; i < count; ++i) {
    const ParamInfo& info = params[i];
    size_t want = static_cast<size_t>(info.num_elements());
    if (info.sparse) {
      if (p.keys.size() != count) {
        return absl::InvalidArgumentError(absl::StrCat("params.keys has ", p.keys.size(), " entries, want ", count));
      }
      absl::Span<const uint64_t> keys = p.keys[i];
      for (size_t k = 1; k < keys.size(); ++k) {
        if (keys[k] <= keys[k - 1]) {
          return absl::InvalidArgumentError(absl::StrCat("params.keys[", i, "] (", info.name,
                                      ") is not strictly increasing at ", k));
        }
      }
      if (keys.size() > static_cast<size_t>(kMaxModelNnz)) {
        return absl::InvalidArgumentError(absl::StrCat("params.keys[", i, "] has 2^31 or more keys"));
      }
      want = keys.size() * info.row_width;
    }
    if (p.values[i].size() != want) {
      return absl::InvalidArgumentError(absl::StrCat("params.values[", i, "] (", info.name, ") has ",
                                  p.values[i].size(), " floats, want ", want));
    }
    if (g != nullptr && g->values[i].size() != want) {
      return absl::InvalidArgumentError(absl::StrCat("grads.values[", i, "] (", info.name, ") has ",
                                  g->values[i].size(), " floats, want ", want));
    }
  }
  return absl::OkStatus();
}

}  // namespace pscluster::kernels
