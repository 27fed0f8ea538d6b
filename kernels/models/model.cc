#include "kernels/models/model.h"

namespace pscluster::kernels {

int64_t ParamInfo::num_elements() const {
  if (sparse) return row_width;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace pscluster::kernels
