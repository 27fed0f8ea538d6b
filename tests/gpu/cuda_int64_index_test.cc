// The CUDA kernels' int64 index paths on tensors past 2^31 elements (about 20 GB of device
// memory): elementwise ops and casts on 2^31 + 7 elements; row gather, scatter-add, embedding
// bags and column sums over a table of more than 2^31 floats. Inputs are a constant with
// windows of a pattern uploaded from the host (at the start, at the int32 paths' limit, and at
// the end, across 2^31); outputs are poisoned first, and the windows, plus what lies just past
// each op's end, are read back and checked on the host. Tagged gpu; skips without a device.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/half_bits.h"
#include "kernels/create_backend.h"

namespace pscluster::kernels {
namespace {

constexpr int64_t kBig = (int64_t{1} << 31) + 7;           // Elementwise ops and casts.
constexpr int64_t kWidth = 64;
constexpr int64_t kRows = (int64_t{1} << 25) + 1;          // Table rows of kWidth floats.
constexpr int64_t kAlloc = kRows * kWidth;                 // 2^31 + 64 floats, >= kBig.
constexpr int64_t kWin = 8192;                             // Floats per checked window.
constexpr float kConst = 1.5f;
// At the start, around the limit of the kernels' int32 paths, and the end (which spans 2^31).
const int64_t kWindows[] = {0, (int64_t{1} << 31) - (int64_t{1} << 26) - kWin / 2,
                            kAlloc - kWin};

float Pattern(int64_t i) { return static_cast<float>(i % 2003 - 1001) * 0.125f; }

bool InWindow(int64_t i) {
  for (int64_t w : kWindows) {
    if (i >= w && i < w + kWin) return true;
  }
  return false;
}

// x's value at i after SetUp.
float X(int64_t i) { return InWindow(i) ? Pattern(i) : kConst; }

float Poison() { return std::numeric_limits<float>::quiet_NaN(); }

class CudaInt64IndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cuda = CreateBackend("cuda", BackendOptions());
    if (!cuda.ok()) GTEST_SKIP() << "no CUDA device: " << cuda.status();
    b_ = std::move(*cuda);
    auto bx = b_->Allocate(sizeof(float) * kAlloc);
    auto by = b_->Allocate(sizeof(float) * kAlloc);
    auto bh = b_->Allocate(sizeof(uint16_t) * kBig);
    ASSERT_TRUE(bx.ok() && by.ok() && bh.ok())
        << "needs about 20 GB of device memory on " << b_->name();
    x_ = std::move(*bx);
    y_ = std::move(*by);
    h_ = std::move(*bh);
    Ok(b_->Fill(kAlloc, kConst, x()));
    for (int64_t w : kWindows) {
      std::vector<float> v(kWin);
      for (int64_t i = 0; i < kWin; ++i) v[i] = Pattern(w + i);
      Ok(b_->CopyToDevice(v.data(), x() + w, sizeof(float) * kWin));
      Ok(b_->Synchronize());  // v goes out of scope.
    }
  }

  float* x() const { return x_.as<float>(); }
  float* y() const { return y_.as<float>(); }
  uint16_t* h() const { return h_.as<uint16_t>(); }

  void Ok(absl::Status s) { ASSERT_TRUE(s.ok()) << s; }

  template <typename T>
  std::vector<T> Get(const T* p, int64_t start, int64_t n) {
    std::vector<T> out(n);
    EXPECT_TRUE(b_->CopyToHost(p + start, out.data(), sizeof(T) * n).ok());
    EXPECT_TRUE(b_->Synchronize().ok());
    return out;
  }

  // Every window of y (up to `n`) equals want(i); the floats just past n keep the poison.
  template <typename F>
  void CheckY(int64_t n, F want, const std::string& what) {
    for (int64_t w : kWindows) {
      const int64_t len = std::min(kWin, n - w);
      if (len <= 0) continue;
      const std::vector<float> got = Get(y(), w, len);
      for (int64_t i = 0; i < len; ++i) {
        const float e = want(w + i);
        ASSERT_TRUE(got[i] == e || (std::isnan(got[i]) && std::isnan(e)))
            << what << ": y[" << w + i << "] = " << got[i] << ", want " << e;
      }
    }
    for (int64_t i : {int64_t{1} << 20, int64_t{3} << 29}) {  // Constant stretches.
      ASSERT_EQ(Get(y(), i, 1)[0], want(i)) << what << " at " << i;
    }
    if (n < kAlloc) {
      for (float v : Get(y(), n, kAlloc - n)) ASSERT_TRUE(std::isnan(v)) << what << " wrote past n";
    }
  }

  std::unique_ptr<Backend> b_;
  Buffer x_, y_, h_;
};

TEST_F(CudaInt64IndexTest, ElementwiseOpsAndCastsReachTheLastElement) {
  auto relu = [](int64_t i) { return std::max(X(i), 0.0f); };
  Ok(b_->Fill(kAlloc, Poison(), y()));
  Ok(b_->ActivationForward(Activation::kRelu, kBig, x(), y()));
  CheckY(kBig, relu, "relu forward");

  // Off by one float: the kernels' scalar (not float4) path.
  Ok(b_->Fill(kAlloc, Poison(), y()));
  Ok(b_->ActivationForward(Activation::kRelu, kBig - 1, x() + 1, y() + 1));
  CheckY(kBig, [&](int64_t i) { return i == 0 ? Poison() : relu(i); }, "relu forward, unaligned");

  Ok(b_->Fill(kAlloc, Poison(), y()));
  Ok(b_->ActivationBackward(Activation::kRelu, kBig, x(), x(), y()));
  CheckY(kBig, relu, "relu backward");

  Ok(b_->Fill(kAlloc, Poison(), y()));
  Ok(b_->Fill(kBig, 3.0f, y()));
  CheckY(kBig, [](int64_t) { return 3.0f; }, "fill");

  for (HalfType type : {HalfType::kFloat16, HalfType::kBFloat16}) {
    const bool bf16 = type == HalfType::kBFloat16;
    auto to_bits = [&](float f) { return bf16 ? FloatToBFloat16Bits(f) : FloatToHalfBits(f); };
    auto from_bits = [&](uint16_t u) { return bf16 ? BFloat16BitsToFloat(u) : HalfBitsToFloat(u); };
    Ok(b_->CastToHalf(type, kBig, x(), h()));
    const std::vector<uint16_t> tail = Get(h(), kBig - kWin, kWin);
    for (int64_t i = 0; i < kWin; ++i) {
      ASSERT_EQ(tail[i], to_bits(X(kBig - kWin + i))) << "cast to half at " << kBig - kWin + i;
    }
    Ok(b_->Fill(kAlloc, Poison(), y()));
    Ok(b_->CastFromHalf(type, kBig, h(), y()));
    CheckY(kBig, [&](int64_t i) { return from_bits(to_bits(X(i))); }, bf16 ? "bf16" : "fp16");
  }

  std::vector<float> bias(kWidth);
  for (int64_t c = 0; c < kWidth; ++c) bias[c] = 0.5f * static_cast<float>(c);
  auto dbias = b_->Allocate(sizeof(float) * kWidth);
  ASSERT_TRUE(dbias.ok());
  Ok(b_->CopyToDevice(bias.data(), dbias->as<float>(), sizeof(float) * kWidth));
  Ok(b_->AddBias(kRows, kWidth, x(), dbias->as<float>(), y()));
  CheckY(kAlloc, [&](int64_t i) { return X(i) + bias[i % kWidth]; }, "add bias");
}

// The rows that lie wholly inside the windows.
std::vector<int32_t> WindowRows(int64_t width) {
  std::vector<int32_t> rows;
  for (int64_t w : kWindows) {
    for (int64_t r = (w + width - 1) / width; (r + 1) * width <= w + kWin; ++r) {
      rows.push_back(static_cast<int32_t>(r));
    }
  }
  return rows;
}

TEST_F(CudaInt64IndexTest, RowOpsOnATablePastTwoToTheThirtyOne) {
  for (int64_t width : {kWidth, int64_t{16}}) {  // Wide and narrow (one warp per bag) kernels.
    SCOPED_TRACE(absl::StrCat("width ", width));
    const int64_t rows = kAlloc / width;
    std::vector<int32_t> idx = WindowRows(width);
    idx.push_back(static_cast<int32_t>(rows - 1));
    idx.push_back(static_cast<int32_t>(rows - 1));  // Repeats add twice.
    const int64_t m = static_cast<int64_t>(idx.size());
    auto didx = b_->Allocate(sizeof(int32_t) * m);
    auto small = b_->Allocate(sizeof(float) * m * width);
    ASSERT_TRUE(didx.ok() && small.ok());
    Ok(b_->CopyToDevice(idx.data(), didx->as<int32_t>(), sizeof(int32_t) * m));

    // Gather.
    Ok(b_->GatherRows(m, width, x(), rows, didx->as<int32_t>(), small->as<float>()));
    std::vector<float> got = Get(small->as<float>(), 0, m * width);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t c = 0; c < width; ++c) {
        ASSERT_EQ(got[i * width + c], X(int64_t{idx[i]} * width + c)) << "gather row " << idx[i];
      }
    }

    // Scatter-add of 0.25 into a copy of the table, and the embedding bag backward of
    // weight 1 x dout 0.25 (one entry per bag) on top: each listed row gains 0.5 per listing.
    Ok(b_->CopyOnDevice(x(), y(), sizeof(float) * kAlloc));
    Ok(b_->Fill(m * width, 0.25f, small->as<float>()));
    Ok(b_->ScatterAddRows(m, width, small->as<float>(), didx->as<int32_t>(), rows, y()));
    std::vector<int32_t> offsets(m + 1);
    for (int64_t i = 0; i <= m; ++i) offsets[i] = static_cast<int32_t>(i);
    auto doff = b_->Allocate(sizeof(int32_t) * (m + 1));
    auto dw = b_->Allocate(sizeof(float) * m);
    auto out = b_->Allocate(sizeof(float) * m * width);
    ASSERT_TRUE(doff.ok() && dw.ok() && out.ok());
    Ok(b_->CopyToDevice(offsets.data(), doff->as<int32_t>(), sizeof(int32_t) * (m + 1)));
    Ok(b_->Fill(m, 1.0f, dw->as<float>()));
    Ok(b_->EmbeddingBagBackward(m, width, m, doff->as<int32_t>(), didx->as<int32_t>(),
                                dw->as<float>(), small->as<float>(), rows, y()));
    for (int64_t i = 0; i < m; ++i) {
      const int64_t listed = std::count(idx.begin(), idx.end(), idx[i]);
      const std::vector<float> row = Get(y(), int64_t{idx[i]} * width, width);
      for (int64_t c = 0; c < width; ++c) {
        ASSERT_EQ(row[c], X(int64_t{idx[i]} * width + c) + 0.5f * listed)
            << "scatter-add / bag backward row " << idx[i];
      }
    }

    // Bag forward: each bag reads its one row with weight 2.
    Ok(b_->Fill(m, 2.0f, dw->as<float>()));
    Ok(b_->EmbeddingBagForward(m, width, m, doff->as<int32_t>(), didx->as<int32_t>(),
                               dw->as<float>(), x(), rows, out->as<float>()));
    got = Get(out->as<float>(), 0, m * width);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t c = 0; c < width; ++c) {
        ASSERT_EQ(got[i * width + c], 2.0f * X(int64_t{idx[i]} * width + c))
            << "bag forward row " << idx[i];
      }
    }
    Ok(b_->Synchronize());
  }
}

TEST_F(CudaInt64IndexTest, ColumnSumOverMoreThanTwoToTheThirtyOneFloats) {
  auto out = b_->Allocate(sizeof(float) * kWidth);
  ASSERT_TRUE(out.ok());
  Ok(b_->ColumnSum(kRows, kWidth, x(), false, out->as<float>()));
  const std::vector<float> got = Get(out->as<float>(), 0, kWidth);
  std::vector<double> want(kWidth, static_cast<double>(kConst) * kRows);
  for (int64_t w : kWindows) {
    for (int64_t i = w; i < w + kWin; ++i) want[i % kWidth] += Pattern(i) - kConst;
  }
  for (int64_t c = 0; c < kWidth; ++c) {
    EXPECT_NEAR(got[c], want[c], 1e-5 * std::fabs(want[c])) << "column " << c;
  }
}

}  // namespace
}  // namespace pscluster::kernels
