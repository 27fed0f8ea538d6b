// Early-return helpers for absl::Status inside kernels/.
#ifndef PSCLUSTER_KERNELS_STATUS_MACROS_H_
#define PSCLUSTER_KERNELS_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KERNELS_CONCAT_INNER_(a, b) a##b
#define KERNELS_CONCAT_(a, b) KERNELS_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function when it is not OK.
#define KERNELS_RETURN_IF_ERROR(expr)                 \
  do {                                                \
    ::absl::Status kernels_status_ = (expr);          \
    if (!kernels_status_.ok()) return kernels_status_; \
  } while (0)

// `lhs = value of expr` when OK; returns its status from the enclosing function otherwise.
#define KERNELS_ASSIGN_OR_RETURN(lhs, expr) \
  KERNELS_ASSIGN_OR_RETURN_IMPL_(KERNELS_CONCAT_(kernels_statusor_, __LINE__), lhs, expr)
#define KERNELS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()

#endif  // PSCLUSTER_KERNELS_STATUS_MACROS_H_
