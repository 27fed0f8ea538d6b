#include "kernels/testing/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/half_bits.h"

namespace pscluster::kernels::testing {
namespace {

constexpr double u = kUnitRoundoff;

double At(const std::vector<float>& m, Trans t, int64_t rows, int64_t cols, int64_t i, int64_t j) {
  // Element (i, j) of op(M), where op(M) is [rows, cols].
  return t == Trans::kNo ? m[i * cols + j] : m[j * rows + i];
}

}  // namespace

Reference RefGemm(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                  const std::vector<float>& a, const std::vector<float>& b, float beta,
                  const std::vector<float>& c) {
  Reference r;
  r.value.resize(m * n);
  r.bound.resize(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0, abs_dot = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double prod = At(a, ta, m, k, i, p) * At(b, tb, k, n, p, j);
        dot += prod;
        abs_dot += std::fabs(prod);
      }
      double v = alpha * dot, mag = std::fabs(alpha) * abs_dot;
      if (beta != 0.0f) {
        v += static_cast<double>(beta) * c[i * n + j];
        mag += std::fabs(static_cast<double>(beta) * c[i * n + j]);
      }
      r.value[i * n + j] = v;
      r.bound[i * n + j] = 2.0 * (k + 4) * u * mag;
    }
  }
  return r;
}

Reference RefAddBias(int64_t rows, int64_t cols, const std::vector<float>& x,
                     const std::vector<float>& bias) {
  Reference r;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const double v = static_cast<double>(x[i * cols + j]) + bias[j];
      r.value.push_back(v);
      r.bound.push_back(u * std::fabs(v));
    }
  }
  return r;
}

Reference RefColumnSum(int64_t rows, int64_t cols, const std::vector<float>& x, bool accumulate,
                       const std::vector<float>& out) {
  Reference r;
  for (int64_t j = 0; j < cols; ++j) {
    double s = accumulate ? out[j] : 0.0, mag = std::fabs(s);
    for (int64_t i = 0; i < rows; ++i) {
      s += x[i * cols + j];
      mag += std::fabs(x[i * cols + j]);
    }
    r.value.push_back(s);
    r.bound.push_back(2.0 * (rows + 2) * u * mag);
  }
  return r;
}

Reference RefActivationForward(Activation f, const std::vector<float>& x) {
  Reference r;
  for (float xf : x) {
    const double v = xf;
    if (f == Activation::kRelu) {
      r.value.push_back(v < 0 ? 0.0 : v);
      r.bound.push_back(0.0);
    } else {
      const double y = 0.5 * v * std::erfc(-v / std::sqrt(2.0));
      r.value.push_back(y);
      // erfc's argument carries a rounding error that the function amplifies by ~2 z^2 for
      // large |z|; the rest is a few roundings of the result.
      r.bound.push_back(u * (16.0 + 4.0 * v * v) * std::fabs(y) + 1e-40);
    }
  }
  return r;
}

Reference RefActivationBackward(Activation f, const std::vector<float>& x,
                                const std::vector<float>& dy) {
  Reference r;
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i], g = dy[i];
    if (f == Activation::kRelu) {
      r.value.push_back(v > 0 ? g : 0.0);
      r.bound.push_back(0.0);
    } else {
      const double cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
      const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
      r.value.push_back(g * (cdf + v * pdf));
      r.bound.push_back(u * (16.0 + 4.0 * v * v) * std::fabs(g) * (cdf + std::fabs(v * pdf)) +
                        1e-40);
    }
  }
  return r;
}

void RefSoftmaxCrossEntropy(int64_t rows, int64_t classes, const std::vector<float>& logits,
                            const std::vector<int32_t>& labels, float grad_scale,
                            Reference* dlogits, Reference* row_stats) {
  *dlogits = Reference();
  *row_stats = Reference();
  for (int64_t i = 0; i < rows; ++i) {
    const float* z = logits.data() + i * classes;
    double max = z[0], min = z[0];
    int64_t argmax = 0;
    for (int64_t j = 1; j < classes; ++j) {
      if (z[j] > max) {
        max = z[j];
        argmax = j;
      }
      min = std::min<double>(min, z[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < classes; ++j) sum += std::exp(z[j] - max);
    const double log_sum = std::log(sum);
    const int32_t label = labels[i];
    const double loss = log_sum - (z[label] - max);
    const double range = max - min;
    row_stats->value.push_back(loss);
    row_stats->bound.push_back(4.0 * u *
                               (range + classes + 8 + std::fabs(log_sum) + std::fabs(z[label] - max)));
    row_stats->value.push_back(argmax == label ? 1.0 : 0.0);
    row_stats->bound.push_back(0.0);
    for (int64_t j = 0; j < classes; ++j) {
      const double p = std::exp(z[j] - max) / sum;
      dlogits->value.push_back(grad_scale * (p - (j == label ? 1.0 : 0.0)));
      dlogits->bound.push_back(std::fabs(grad_scale) *
                               (4.0 * u * (std::fabs(z[j] - max) + classes + 8) * p +
                                (j == label ? 4.0 * u : 0.0)) +
                               1e-40);
    }
  }
}

void RefSigmoidCrossEntropy(const std::vector<float>& logits, const std::vector<int32_t>& labels,
                            float grad_scale, Reference* dlogits, Reference* row_stats) {
  *dlogits = Reference();
  *row_stats = Reference();
  for (size_t i = 0; i < logits.size(); ++i) {
    const double z = logits[i];
    const double y = labels[i];
    // log(1 + e^z) - y z; the two forms agree, the one used never overflows.
    const double soft = std::log1p(std::exp(-std::fabs(z)));
    const double loss = std::isnan(z) ? z : std::max(z, 0.0) - y * z + soft;
    // The float32 result: max(z, 0) - y z is exact for y in {0, 1}; exp and log1p carry a few
    // ulps of `soft` (CUDA's expf is within 2 ulps, log1pf 1), and the final sum one rounding.
    // Subnormal exponentials (|z| > 87) are covered by the absolute term.
    row_stats->value.push_back(loss);
    row_stats->bound.push_back(u * (2.0 * std::fabs(loss) + 12.0 * soft) + 1e-40);
    row_stats->value.push_back((z > 0) == (labels[i] == 1) ? 1.0 : 0.0);
    row_stats->bound.push_back(0.0);
    const double p = 1.0 / (1.0 + std::exp(-z));
    dlogits->value.push_back(grad_scale * (p - y));
    // sigmoid(z) to ~6 roundings (exp's ulps, 1 + e, the division), then p - y and the scale.
    dlogits->bound.push_back(std::fabs(grad_scale) * (10.0 * u * p + 2.0 * u * std::fabs(p - y)) +
                             1e-40 * (1.0 + std::fabs(grad_scale)));
  }
}

Reference RefCopyBlock(int64_t rows, int64_t cols, const std::vector<float>& src,
                       int64_t src_stride, const std::vector<float>& dst, int64_t dst_stride,
                       bool accumulate) {
  Reference r;
  r.value.assign(dst.begin(), dst.end());
  r.bound.assign(dst.size(), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t d = i * dst_stride + j;
      const double s = src[i * src_stride + j];
      r.value[d] = accumulate ? r.value[d] + s : s;
      r.bound[d] = accumulate ? u * std::fabs(r.value[d]) : 0.0;
    }
  }
  return r;
}

Reference RefFmForward(int64_t rows, int64_t vectors, int64_t width, const std::vector<float>& x) {
  Reference r;
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = x.data() + i * vectors * width;
    double v = 0;
    for (int64_t a = 0; a < vectors; ++a) {
      for (int64_t b = a + 1; b < vectors; ++b) {
        for (int64_t k = 0; k < width; ++k) {
          v += static_cast<double>(xr[a * width + k]) * xr[b * width + k];
        }
      }
    }
    // 0.5 sum_k (s_k^2 - q_k) in float32: s_k and q_k each carry ~vectors roundings of
    // m_k = sum_a |x[a,k]|, squaring doubles s_k's, and the sum over k (sequential, or by lanes
    // and a 32-way butterfly) adds up to width + 5 more.
    double mag = 0;
    for (int64_t k = 0; k < width; ++k) {
      double m = 0;
      for (int64_t a = 0; a < vectors; ++a) m += std::fabs(xr[a * width + k]);
      mag += m * m;
    }
    r.value.push_back(v);
    r.bound.push_back((3.0 * vectors + width + 10) * u * mag + 1e-40);
  }
  return r;
}

Reference RefFmBackward(int64_t rows, int64_t vectors, int64_t width, const std::vector<float>& x,
                        const std::vector<float>& dout) {
  Reference r;
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = x.data() + i * vectors * width;
    const double g = dout[i];
    for (int64_t a = 0; a < vectors; ++a) {
      for (int64_t k = 0; k < width; ++k) {
        double s = 0, m = 0;
        for (int64_t b = 0; b < vectors; ++b) {
          m += std::fabs(xr[b * width + k]);
          if (b != a) s += xr[b * width + k];
        }
        r.value.push_back(g * s);
        r.bound.push_back(2.0 * (vectors + 2) * u * std::fabs(g) * m + 1e-40);
      }
    }
  }
  return r;
}

Reference RefDotInteractionForward(int64_t rows, int64_t vectors, int64_t width,
                                   const std::vector<float>& x) {
  Reference r;
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = x.data() + i * vectors * width;
    // Pairs (a, b) with a > b in the documented order: (1,0), (2,0), (2,1), (3,0), ...
    for (int64_t a = 1; a < vectors; ++a) {
      for (int64_t b = 0; b < a; ++b) {
        double dot = 0, mag = 0;
        for (int64_t k = 0; k < width; ++k) {
          const double t = static_cast<double>(xr[a * width + k]) * xr[b * width + k];
          dot += t;
          mag += std::fabs(t);
        }
        r.value.push_back(dot);
        r.bound.push_back(2.0 * (width + 2) * u * mag + 1e-40);
      }
    }
  }
  return r;
}

Reference RefDotInteractionBackward(int64_t rows, int64_t vectors, int64_t width,
                                    const std::vector<float>& x, const std::vector<float>& dout) {
  Reference r;
  // Each unordered pair's position, by counting through the documented order.
  std::vector<int64_t> position(vectors * vectors, -1);
  int64_t pairs = 0;
  for (int64_t a = 1; a < vectors; ++a) {
    for (int64_t b = 0; b < a; ++b) position[a * vectors + b] = position[b * vectors + a] = pairs++;
  }
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = x.data() + i * vectors * width;
    const float* g = dout.data() + i * pairs;
    for (int64_t a = 0; a < vectors; ++a) {
      for (int64_t k = 0; k < width; ++k) {
        double v = 0, mag = 0;
        for (int64_t b = 0; b < vectors; ++b) {
          if (b == a) continue;
          const int64_t p = position[a * vectors + b];
          const double t = static_cast<double>(g[p]) * xr[b * width + k];
          v += t;
          mag += std::fabs(t);
        }
        r.value.push_back(v);
        r.bound.push_back(2.0 * (vectors + 2) * u * mag + 1e-40);
      }
    }
  }
  return r;
}

std::vector<float> RefGatherRows(int64_t width, const std::vector<float>& table,
                                 const std::vector<int32_t>& idx) {
  std::vector<float> out;
  for (int32_t r : idx) {
    out.insert(out.end(), table.begin() + r * width, table.begin() + (r + 1) * width);
  }
  return out;
}

Reference RefScatterAddRows(int64_t width, const std::vector<float>& src,
                            const std::vector<int32_t>& idx, const std::vector<float>& table) {
  Reference r;
  r.value.assign(table.begin(), table.end());
  std::vector<double> mag(table.size()), count(table.size(), 0.0);
  for (size_t i = 0; i < table.size(); ++i) mag[i] = std::fabs(table[i]);
  for (size_t i = 0; i < idx.size(); ++i) {
    for (int64_t c = 0; c < width; ++c) {
      const int64_t t = idx[i] * width + c;
      r.value[t] += src[i * width + c];
      mag[t] += std::fabs(src[i * width + c]);
      count[t] += 1;
    }
  }
  for (size_t i = 0; i < table.size(); ++i) r.bound.push_back(2.0 * (count[i] + 2) * u * mag[i]);
  return r;
}

Reference RefEmbeddingBagForward(int64_t width, const std::vector<int32_t>& offsets,
                                 const std::vector<int32_t>& idx,
                                 const std::vector<float>& weights,
                                 const std::vector<float>& table) {
  Reference r;
  const int64_t bags = static_cast<int64_t>(offsets.size()) - 1;
  for (int64_t b = 0; b < bags; ++b) {
    for (int64_t c = 0; c < width; ++c) {
      double s = 0, mag = 0;
      for (int32_t j = offsets[b]; j < offsets[b + 1]; ++j) {
        const double t = static_cast<double>(weights[j]) * table[idx[j] * width + c];
        s += t;
        mag += std::fabs(t);
      }
      r.value.push_back(s);
      r.bound.push_back(2.0 * (offsets[b + 1] - offsets[b] + 2) * u * mag);
    }
  }
  return r;
}

Reference RefEmbeddingBagBackward(int64_t width, const std::vector<int32_t>& offsets,
                                  const std::vector<int32_t>& idx,
                                  const std::vector<float>& weights,
                                  const std::vector<float>& dout,
                                  const std::vector<float>& dtable) {
  Reference r;
  r.value.assign(dtable.begin(), dtable.end());
  std::vector<double> mag(dtable.size()), count(dtable.size(), 0.0);
  for (size_t i = 0; i < dtable.size(); ++i) mag[i] = std::fabs(dtable[i]);
  const int64_t bags = static_cast<int64_t>(offsets.size()) - 1;
  for (int64_t b = 0; b < bags; ++b) {
    for (int32_t j = offsets[b]; j < offsets[b + 1]; ++j) {
      for (int64_t c = 0; c < width; ++c) {
        const double t = static_cast<double>(weights[j]) * dout[b * width + c];
        r.value[idx[j] * width + c] += t;
        mag[idx[j] * width + c] += std::fabs(t);
        count[idx[j] * width + c] += 1;
      }
    }
  }
  for (size_t i = 0; i < dtable.size(); ++i) r.bound.push_back(2.0 * (count[i] + 3) * u * mag[i]);
  return r;
}

std::vector<int32_t> RefTopKAbs(const std::vector<float>& x, int64_t k) {
  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const bool nan_a = std::isnan(x[a]), nan_b = std::isnan(x[b]);
    if (nan_a || nan_b) return nan_a && !nan_b;  // NaN first; NaNs keep index order.
    return std::fabs(static_cast<double>(x[a])) > std::fabs(static_cast<double>(x[b]));
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<float> RefIm2Col(const ConvGeometry& g, const std::vector<float>& x) {
  std::vector<float> cols;
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t oy = 0; oy < g.out_h(); ++oy) {
      for (int64_t ox = 0; ox < g.out_w(); ++ox) {
        for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
          for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
            for (int64_t c = 0; c < g.channels; ++c) {
              const int64_t iy = oy * g.stride - g.pad_h + ky;
              const int64_t ix = ox * g.stride - g.pad_w + kx;
              const bool inside = iy >= 0 && iy < g.height && ix >= 0 && ix < g.width;
              cols.push_back(inside ? x[((b * g.height + iy) * g.width + ix) * g.channels + c]
                                    : 0.0f);
            }
          }
        }
      }
    }
  }
  return cols;
}

Reference RefCol2Im(const ConvGeometry& g, const std::vector<float>& cols) {
  // The adjoint of RefIm2Col, computed by replaying its reads as adds.
  Reference r;
  r.value.assign(g.input_size(), 0.0);
  std::vector<double> mag(g.input_size(), 0.0), count(g.input_size(), 0.0);
  int64_t pos = 0;
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t oy = 0; oy < g.out_h(); ++oy) {
      for (int64_t ox = 0; ox < g.out_w(); ++ox) {
        for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
          for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
            for (int64_t c = 0; c < g.channels; ++c, ++pos) {
              const int64_t iy = oy * g.stride - g.pad_h + ky;
              const int64_t ix = ox * g.stride - g.pad_w + kx;
              if (iy < 0 || iy >= g.height || ix < 0 || ix >= g.width) continue;
              const int64_t t = ((b * g.height + iy) * g.width + ix) * g.channels + c;
              r.value[t] += cols[pos];
              mag[t] += std::fabs(cols[pos]);
              count[t] += 1;
            }
          }
        }
      }
    }
  }
  for (int64_t i = 0; i < g.input_size(); ++i) r.bound.push_back(2.0 * (count[i] + 1) * u * mag[i]);
  return r;
}

void RefMaxPoolForward(const PoolGeometry& g, const std::vector<float>& x, std::vector<float>* y,
                       std::vector<int32_t>* argmax) {
  y->clear();
  argmax->clear();
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t oy = 0; oy < g.out_h(); ++oy) {
      for (int64_t ox = 0; ox < g.out_w(); ++ox) {
        for (int64_t c = 0; c < g.channels; ++c) {
          int64_t best = -1;
          for (int64_t wy = 0; wy < g.window; ++wy) {
            for (int64_t wx = 0; wx < g.window; ++wx) {
              const int64_t i =
                  ((b * g.height + oy * g.stride + wy) * g.width + ox * g.stride + wx) *
                      g.channels + c;
              if (best < 0) {
                best = i;
              } else if (!std::isnan(x[best]) && (std::isnan(x[i]) || x[i] > x[best])) {
                best = i;
              }
            }
          }
          y->push_back(x[best]);
          argmax->push_back(static_cast<int32_t>(best));
        }
      }
    }
  }
}

Reference RefMaxPoolBackward(const PoolGeometry& g, const std::vector<float>& dy,
                             const std::vector<int32_t>& argmax) {
  Reference r;
  r.value.assign(g.input_size(), 0.0);
  std::vector<double> mag(g.input_size(), 0.0), count(g.input_size(), 0.0);
  for (size_t q = 0; q < dy.size(); ++q) {
    r.value[argmax[q]] += dy[q];
    mag[argmax[q]] += std::fabs(dy[q]);
    count[argmax[q]] += 1;
  }
  for (int64_t i = 0; i < g.input_size(); ++i) r.bound.push_back(2.0 * (count[i] + 1) * u * mag[i]);
  return r;
}

}  // namespace pscluster::kernels::testing
