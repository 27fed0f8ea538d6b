#include "server/client/error_feedback.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "common/dtype.h"
#include "common/grad_compress.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

// The dense values a servers would decode from one step's compressed blocks.
std::vector<float> Decode(const std::vector<CompressedBlock>& blocks, uint64_t elems,
                          uint64_t block_elems) {
  std::vector<float> out(elems, 0.f);
  for (size_t b = 0; b < blocks.size(); ++b) {
    const CompressedBlock& cb = blocks[b];
    float* dst = out.data() + b * block_elems;
    if (cb.dtype == v1::DT_INT8) {
      const size_t n = cb.values.size();
      std::vector<float> scales(cb.scales.size() / 4);
      std::memcpy(scales.data(), cb.scales.data(), cb.scales.size());
      DequantizeInt8(reinterpret_cast<const int8_t*>(cb.values.data()), n, kInt8ScaleGroup,
                     scales.data(), dst);
      continue;
    }
    const size_t k = cb.indices.size() / 4;
    std::vector<float> vals(k);
    DecodeFloats(cb.values.data(), k, cb.dtype, vals.data());
    for (size_t i = 0; i < k; ++i) {
      uint32_t idx;
      std::memcpy(&idx, cb.indices.data() + 4 * i, 4);
      dst[idx] += vals[i];
    }
  }
  return out;
}

v1::CompressionSpec TopK(float ratio) {
  v1::CompressionSpec cs;
  cs.set_topk_ratio(ratio);
  return cs;
}
v1::CompressionSpec Int8() {
  v1::CompressionSpec cs;
  cs.set_quantize(v1::CompressionSpec::QUANTIZE_INT8);
  return cs;
}

// Over many steps, per element: what was sent plus the residual equals the sum of the gradients.
void ExpectNothingLost(const v1::CompressionSpec& cs, v1::DataType transport, double tol) {
  const uint64_t elems = 1000, block = 300;  // Four blocks, the last one short.
  ErrorFeedback ef(elems, block, cs, transport);
  std::mt19937 rng(11);
  std::normal_distribution<float> d;
  std::vector<double> grads(elems, 0), sent(elems, 0);
  std::vector<float> g(elems);
  for (int step = 0; step < 50; ++step) {
    for (uint64_t i = 0; i < elems; ++i) {
      g[i] = d(rng) * (i % 7 == 0 ? 10.f : 0.1f);
      grads[i] += g[i];
    }
    auto blocks = ef.Compress(step, g.data());
    ASSERT_TRUE(blocks.ok()) << blocks.status();
    ASSERT_EQ(blocks->size(), 4u);
    const auto dec = Decode(*blocks, elems, block);
    for (uint64_t i = 0; i < elems; ++i) sent[i] += dec[i];
  }
  for (uint64_t i = 0; i < elems; ++i) {
    EXPECT_NEAR(sent[i] + ef.residual()[i], grads[i], tol) << i;
  }
}

TEST(ErrorFeedbackTest, TopKSentPlusResidualIsTheSumOfGradients) {
  ExpectNothingLost(TopK(0.01f), v1::DT_FLOAT32, 1e-3);
}

TEST(ErrorFeedbackTest, TopKWithFp16KeepsTheRoundingInTheResidual) {
  ExpectNothingLost(TopK(0.05f), v1::DT_FLOAT16, 1e-3);
}

TEST(ErrorFeedbackTest, Int8SentPlusResidualIsTheSumOfGradients) {
  ExpectNothingLost(Int8(), v1::DT_FLOAT32, 1e-3);
}

// The compression of one block as written first (a copy of c, a dense `sent`, left = c - sent),
// through the scalar reference codecs: ErrorFeedback must give the same bytes and residual bits.
CompressedBlock ReferenceBlock(const float* c, uint64_t n, const v1::CompressionSpec& spec,
                               v1::DataType transport, float* left) {
  CompressedBlock out;
  std::vector<float> sent(n, 0.f);
  if (spec.quantize() == v1::CompressionSpec::QUANTIZE_INT8) {
    out.dtype = v1::DT_INT8;
    out.values.resize(n);
    std::vector<float> scales(NumScaleGroups(n, kInt8ScaleGroup));
    auto* q = reinterpret_cast<int8_t*>(out.values.data());
    QuantizeInt8Scalar(c, n, kInt8ScaleGroup, q, scales.data());
    DequantizeInt8Scalar(q, n, kInt8ScaleGroup, scales.data(), sent.data());
    out.scales.assign(reinterpret_cast<const char*>(scales.data()), scales.size() * 4);
  } else {
    out.dtype = transport;
    const std::vector<uint32_t> idx = SelectTopK(c, n, TopKCount(n, spec.topk_ratio()));
    std::vector<float> vals(idx.size());
    for (size_t i = 0; i < idx.size(); ++i) vals[i] = c[idx[i]];
    out.values.resize(vals.size() * DTypeSize(transport));
    EncodeFloatsScalar(vals.data(), vals.size(), transport, out.values.data());
    DecodeFloatsScalar(out.values.data(), vals.size(), transport, vals.data());
    for (size_t i = 0; i < idx.size(); ++i) sent[idx[i]] = vals[i];
    out.indices.assign(reinterpret_cast<const char*>(idx.data()), idx.size() * 4);
  }
  for (uint64_t i = 0; i < n; ++i) left[i] = c[i] - sent[i];
  return out;
}

void ExpectSameAsReference(const v1::CompressionSpec& cs, v1::DataType transport) {
  const uint64_t elems = 70000, block = 65536;  // A long block and a short one.
  ErrorFeedback ef(elems, block, cs, transport);
  std::vector<float> before(elems, 0.f), after(elems, 0.f), c(block);
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.f, 1e-2f);
  std::vector<float> g(elems);
  for (int step = 0; step < 6; ++step) {
    for (float& v : g) v = d(rng);
    if (step == 2) {  // Planted: a zero block start, exact ties of magnitude, a tiny group.
      for (int i = 0; i < 300; ++i) g[i] = -before[i];
      for (int i = 300; i < 400; ++i) g[i] = (i % 2 ? 1.f : -1.f) - before[i];
      for (int i = 512; i < 768; ++i) g[i] = 1e-37f * (i - 600);
    }
    auto blocks = ef.Compress(step, g.data());
    ASSERT_TRUE(blocks.ok()) << blocks.status();
    before.swap(after);
    ASSERT_EQ(blocks->size(), 2u);
    for (uint64_t b = 0, first = 0; first < elems; ++b, first += block) {
      const uint64_t n = std::min(block, elems - first);
      for (uint64_t i = 0; i < n; ++i) c[i] = g[first + i] + before[first + i];
      const CompressedBlock want = ReferenceBlock(c.data(), n, cs, transport, &after[first]);
      const CompressedBlock& got = (*blocks)[b];
      ASSERT_EQ(got.dtype, want.dtype);
      ASSERT_EQ(got.values, want.values) << "step " << step << " block " << b;
      ASSERT_EQ(got.indices, want.indices) << "step " << step << " block " << b;
      ASSERT_EQ(got.scales, want.scales) << "step " << step << " block " << b;
    }
    ASSERT_EQ(std::memcmp(ef.residual().data(), after.data(), elems * 4), 0) << "step " << step;
  }
}

TEST(ErrorFeedbackTest, Int8GivesTheReferenceBits) { ExpectSameAsReference(Int8(), v1::DT_FLOAT32); }

TEST(ErrorFeedbackTest, TopKGivesTheReferenceBits) {
  ExpectSameAsReference(TopK(0.01f), v1::DT_FLOAT32);
  ExpectSameAsReference(TopK(0.05f), v1::DT_FLOAT16);
  ExpectSameAsReference(TopK(0.3f), v1::DT_BFLOAT16);
}

TEST(ErrorFeedbackTest, TopKSendsKPerBlockAndCarriesTheRest) {
  ErrorFeedback ef(10, 5, TopK(0.2f), v1::DT_FLOAT32);  // One element per block.
  const float g0[] = {1, 2, 3, 4, 5, -9, 1, 1, 1, 1};
  auto b0 = ef.Compress(0, g0);
  ASSERT_TRUE(b0.ok());
  ASSERT_EQ(b0->size(), 2u);
  EXPECT_EQ((*b0)[0].indices.size(), 4u);
  EXPECT_EQ((*b0)[0].values.size(), 4u);
  auto d0 = Decode(*b0, 10, 5);
  EXPECT_EQ(d0[4], 5.f);
  EXPECT_EQ(d0[5], -9.f);
  EXPECT_EQ(ef.residual()[3], 4.f);
  EXPECT_EQ(ef.residual()[4], 0.f);
  // Step 1: a zero gradient; the carried 4 is now the largest of block 0 and goes out.
  const float zero[10] = {};
  auto b1 = ef.Compress(1, zero);
  ASSERT_TRUE(b1.ok());
  auto d1 = Decode(*b1, 10, 5);
  EXPECT_EQ(d1[3], 4.f);
  EXPECT_EQ(ef.residual()[3], 0.f);
  EXPECT_EQ(ef.residual()[2], 3.f);
}

TEST(ErrorFeedbackTest, ARetriedStepSendsTheSameAndCountsTheResidualOnce) {
  ErrorFeedback ef(600, 256, Int8(), v1::DT_FLOAT32);
  std::vector<float> g(600);
  for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.37f * i) * 0.01f;
  ASSERT_TRUE(ef.Compress(0, g.data()).ok());
  const std::vector<float> carried = ef.residual();
  auto first = ef.Compress(1, g.data());
  ASSERT_TRUE(first.ok());
  const std::vector<float> after = ef.residual();
  auto again = ef.Compress(1, g.data());  // The push of step 1 failed and is retried.
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(first->size(), again->size());
  for (size_t b = 0; b < first->size(); ++b) {
    EXPECT_EQ((*first)[b].values, (*again)[b].values);
    EXPECT_EQ((*first)[b].scales, (*again)[b].scales);
  }
  EXPECT_EQ(ef.residual(), after);
  EXPECT_NE(carried, after);
  EXPECT_EQ(ef.last_step(), 1);
}

TEST(ErrorFeedbackTest, AnOlderStepIsRefused) {
  ErrorFeedback ef(4, 4, TopK(0.5f), v1::DT_FLOAT32);
  const float g[4] = {1, 2, 3, 4};
  ASSERT_TRUE(ef.Compress(5, g).ok());
  EXPECT_EQ(ef.Compress(4, g).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ErrorFeedbackTest, Int8WireIsAQuarterOfFloat32PlusScales) {
  ErrorFeedback ef(1 << 16, 1 << 16, Int8(), v1::DT_FLOAT32);
  std::vector<float> g(1 << 16, 0.5f);
  auto b = ef.Compress(0, g.data());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)[0].values.size(), 1u << 16);
  EXPECT_EQ((*b)[0].scales.size(), 4u * (1 << 16) / kInt8ScaleGroup);
  EXPECT_TRUE((*b)[0].indices.empty());
}

}  // namespace
}  // namespace pscluster
