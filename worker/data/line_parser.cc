#include "worker/data/line_parser.h"

#include "absl/strings/str_cat.h"

namespace pscluster::data {

std::string LabelRule::Describe() const {
  if (num_classes_ == 2 && base_ == 0) return "a label in {-1, 0, 1}";
  return absl::StrCat("an integer label in [", base_, ", ", base_ + num_classes_ - 1, "]");
}

}  // namespace pscluster::data
