// Float64 reference implementations of the backend ops, straight from their definitions, for
// tests. Each also returns, where rounding makes float32 results differ, a per-element error
// bound from the float32 forward-error analysis of the op (u = 2^-24, the unit round-off).
#ifndef PSCLUSTER_KERNELS_TESTING_REFERENCE_OPS_H_
#define PSCLUSTER_KERNELS_TESTING_REFERENCE_OPS_H_

#include <cstdint>
#include <vector>

#include "kernels/backend.h"

namespace pscluster::kernels::testing {

inline constexpr double kUnitRoundoff = 1.0 / (1 << 24);

// A reference result: values and, per element, the largest acceptable |float32 result - value|.
struct Reference {
  std::vector<double> value;
  std::vector<double> bound;
};

Reference RefGemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                  const std::vector<float>& a, const std::vector<float>& b, float beta,
                  const std::vector<float>& c);
Reference RefAddBias(int64_t rows, int64_t cols, const std::vector<float>& x,
                     const std::vector<float>& bias);
Reference RefColumnSum(int64_t rows, int64_t cols, const std::vector<float>& x, bool accumulate,
                       const std::vector<float>& out);
Reference RefActivationForward(Activation f, const std::vector<float>& x);
Reference RefActivationBackward(Activation f, const std::vector<float>& x,
                                const std::vector<float>& dy);
// Returns dlogits in `dlogits` and (loss, correct) per row in `row_stats`.
void RefSoftmaxCrossEntropy(int64_t rows, int64_t classes, const std::vector<float>& logits,
                            const std::vector<int32_t>& labels, float grad_scale,
                            Reference* dlogits, Reference* row_stats);
// Binary cross-entropy with logits: dlogits and (loss, correct) per row, as
// Backend::SigmoidCrossEntropy defines them (a NaN logit predicts 0; its loss and gradient are
// NaN). Labels must be 0 or 1.
void RefSigmoidCrossEntropy(const std::vector<float>& logits, const std::vector<int32_t>& labels,
                            float grad_scale, Reference* dlogits, Reference* row_stats);
// The whole of dst after CopyBlock: the block copied (exact) or added (one rounding), every other
// element unchanged (exact).
Reference RefCopyBlock(int64_t rows, int64_t cols, const std::vector<float>& src,
                       int64_t src_stride, const std::vector<float>& dst, int64_t dst_stride,
                       bool accumulate);
// Feature interactions over x [rows, vectors, width], from the pairwise definitions. The bounds
// allow for the float32 forms the backends use (the FM's O(vectors) sum of squares included).
Reference RefFmForward(int64_t rows, int64_t vectors, int64_t width, const std::vector<float>& x);
Reference RefFmBackward(int64_t rows, int64_t vectors, int64_t width, const std::vector<float>& x,
                        const std::vector<float>& dout);
Reference RefDotInteractionForward(int64_t rows, int64_t vectors, int64_t width,
                                   const std::vector<float>& x);
Reference RefDotInteractionBackward(int64_t rows, int64_t vectors, int64_t width,
                                    const std::vector<float>& x, const std::vector<float>& dout);
std::vector<float> RefGatherRows(int64_t width, const std::vector<float>& table,
                                 const std::vector<int32_t>& idx);
Reference RefScatterAddRows(int64_t width, const std::vector<float>& src,
                            const std::vector<int32_t>& idx, const std::vector<float>& table);
Reference RefEmbeddingBagForward(int64_t width, const std::vector<int32_t>& offsets,
                                 const std::vector<int32_t>& idx,
                                 const std::vector<float>& weights,
                                 const std::vector<float>& table);
Reference RefEmbeddingBagBackward(int64_t width, const std::vector<int32_t>& offsets,
                                  const std::vector<int32_t>& idx,
                                  const std::vector<float>& weights,
                                  const std::vector<float>& dout,
                                  const std::vector<float>& dtable);
// Indices of the k largest |x| (NaN largest, ties to the lower index), ascending.
std::vector<int32_t> RefTopKAbs(const std::vector<float>& x, int64_t k);
std::vector<float> RefIm2Col(const ConvGeometry& g, const std::vector<float>& x);
Reference RefCol2Im(const ConvGeometry& g, const std::vector<float>& cols);
void RefMaxPoolForward(const PoolGeometry& g, const std::vector<float>& x, std::vector<float>* y,
                       std::vector<int32_t>* argmax);
Reference RefMaxPoolBackward(const PoolGeometry& g, const std::vector<float>& dy,
                             const std::vector<int32_t>& argmax);

}  // namespace pscluster::kernels::testing

#endif  // PSCLUSTER_KERNELS_TESTING_REFERENCE_OPS_H_
