// The CPU cost of the transport codecs (common/dtype.h, common/grad_compress.h,
// server/client/error_feedback.h), against a memcpy of the same bytes measured in the same run:
// each codec's throughput in GB/s of float32 input (elems x 4 bytes per second, one thread) and its
// ratio to memcpy of elems x 4 bytes. Rows:
//   * fp16 / bf16 encode (float32 -> 16 bit) and decode (16 bit -> float32), through the
//     dispatched EncodeFloats / DecodeFloats;
//   * int8 quantize / dequantize (QuantizeInt8 / DequantizeInt8, groups of kInt8ScaleGroup);
//   * the same fp16 and int8 calls through the scalar reference code (what CPUs without AVX2 /
//     F16C run);
//   * top-k 1% selection (SelectTopK: a sampled threshold and one vector pass; and the radix
//     select alone, which it falls back on) and the worker's whole error-feedback compression of
//     one step (ErrorFeedback::Compress) for top-k 1% and int8, as the worker runs them per push:
//     in blocks of kDefaultBlockElems.
// Each rate is the median of --runs timed runs of at least --min_ms each, the rows interleaved
// run by run so that a slow spell of the shared machine hits every row.
//
//   bazel run -c opt //tests/bench:codec_bench -- [--elems=2097152] [--runs=7] [--min_ms=100]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "common/dtype.h"
#include "common/grad_compress.h"
#include "common/sharding.h"
#include "proto/job.pb.h"
#include "server/client/error_feedback.h"

ABSL_FLAG(int64_t, elems, 2 << 20, "float32 values per call (default 8 MiB of float32)");
ABSL_FLAG(int, runs, 7, "timed runs per row (the median is reported)");
ABSL_FLAG(int, min_ms, 100, "least time of one timed run (calls repeated until it is reached)");

namespace pscluster {
namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  std::string name;
  std::function<void()> call;
  std::vector<double> gbps;  // One per run.
};

// Calls `call` until min_ms have passed; GB/s of `bytes` float32 input per call.
double TimeRun(const std::function<void()>& call, double bytes, int min_ms) {
  int calls = 0;
  const Clock::time_point start = Clock::now();
  double secs = 0;
  do {
    call();
    ++calls;
    secs = std::chrono::duration<double>(Clock::now() - start).count();
  } while (secs * 1000 < min_ms);
  return bytes * calls / secs / 1e9;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main() {
  const size_t n = static_cast<size_t>(std::max<int64_t>(1, absl::GetFlag(FLAGS_elems)));
  const int runs = std::max(1, absl::GetFlag(FLAGS_runs));
  const int min_ms = std::max(1, absl::GetFlag(FLAGS_min_ms));
  const double bytes = static_cast<double>(n) * 4;

  // Gradient-like values: normal, a few orders of magnitude, no NaN.
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.f, 1e-2f);
  std::vector<float> x(n), y(n);
  for (float& v : x) v = dist(rng);
  std::vector<uint16_t> h16(n);
  std::vector<int8_t> q(n);
  std::vector<float> scales(NumScaleGroups(n, kInt8ScaleGroup));
  EncodeFloats(x.data(), n, v1::DT_FLOAT16, h16.data());
  std::vector<uint16_t> b16(n);
  EncodeFloats(x.data(), n, v1::DT_BFLOAT16, b16.data());
  QuantizeInt8(x.data(), n, kInt8ScaleGroup, q.data(), scales.data());

  v1::CompressionSpec topk_spec;
  topk_spec.set_topk_ratio(0.01f);
  v1::CompressionSpec int8_spec;
  int8_spec.set_quantize(v1::CompressionSpec::QUANTIZE_INT8);
  // In blocks of the workers' default size, as a dense table's push is compressed.
  ErrorFeedback topk_ef(n, kDefaultBlockElems, topk_spec, v1::DT_FLOAT32);
  ErrorFeedback int8_ef(n, kDefaultBlockElems, int8_spec, v1::DT_FLOAT32);
  int64_t topk_step = 0, int8_step = 0;

  std::vector<Row> rows;
  rows.push_back({"memcpy (baseline)", [&] { std::memcpy(y.data(), x.data(), n * 4); }, {}});
  rows.push_back({"fp16 encode", [&] { EncodeFloats(x.data(), n, v1::DT_FLOAT16, h16.data()); }, {}});
  rows.push_back({"fp16 decode", [&] { DecodeFloats(h16.data(), n, v1::DT_FLOAT16, y.data()); }, {}});
  rows.push_back({"bf16 encode", [&] { EncodeFloats(x.data(), n, v1::DT_BFLOAT16, b16.data()); }, {}});
  rows.push_back({"bf16 decode", [&] { DecodeFloats(b16.data(), n, v1::DT_BFLOAT16, y.data()); }, {}});
  rows.push_back({"int8 quantize",
                  [&] { QuantizeInt8(x.data(), n, kInt8ScaleGroup, q.data(), scales.data()); },
                  {}});
  rows.push_back({"int8 dequantize",
                  [&] { DequantizeInt8(q.data(), n, kInt8ScaleGroup, scales.data(), y.data()); },
                  {}});
  // The element-by-element reference code the dispatched paths fall back to without AVX2 / F16C.
  rows.push_back({"fp16 encode, scalar reference",
                  [&] { EncodeFloatsScalar(x.data(), n, v1::DT_FLOAT16, h16.data()); },
                  {}});
  rows.push_back({"fp16 decode, scalar reference",
                  [&] { DecodeFloatsScalar(h16.data(), n, v1::DT_FLOAT16, y.data()); },
                  {}});
  rows.push_back({"int8 quantize, scalar reference",
                  [&] { QuantizeInt8Scalar(x.data(), n, kInt8ScaleGroup, q.data(), scales.data()); },
                  {}});
  rows.push_back({"int8 dequantize, scalar reference",
                  [&] {
                    DequantizeInt8Scalar(q.data(), n, kInt8ScaleGroup, scales.data(), y.data());
                  },
                  {}});
  rows.push_back({"top-k 1% select",
                  [&] {
                    for (size_t first = 0; first < n; first += kDefaultBlockElems) {
                      const size_t len = std::min<size_t>(kDefaultBlockElems, n - first);
                      SelectTopK(x.data() + first, len, TopKCount(len, 0.01f));
                    }
                  },
                  {}});
  rows.push_back({"top-k 1% select, radix select only",
                  [&] {
                    for (size_t first = 0; first < n; first += kDefaultBlockElems) {
                      const size_t len = std::min<size_t>(kDefaultBlockElems, n - first);
                      SelectTopKRadix(x.data() + first, len, TopKCount(len, 0.01f));
                    }
                  },
                  {}});
  rows.push_back({"int8 error-feedback step",
                  [&] { (void)int8_ef.Compress(int8_step++, x.data()); },
                  {}});
  rows.push_back({"top-k 1% error-feedback step",
                  [&] { (void)topk_ef.Compress(topk_step++, x.data()); },
                  {}});

  for (int r = 0; r < runs; ++r) {
    for (Row& row : rows) row.gbps.push_back(TimeRun(row.call, bytes, min_ms));
  }
  const double base = Median(rows[0].gbps);
  std::printf("%zu float32 values (%.1f MiB) per call, median of %d runs\n\n", n,
              bytes / (1 << 20), runs);
  std::printf("| codec | GB/s of float32 | vs memcpy |\n|---|---|---|\n");
  for (const Row& row : rows) {
    const double m = Median(row.gbps);
    std::printf("| %s | %.2f | %.3f |\n", row.name.c_str(), m, m / base);
  }
  return 0;
}

}  // namespace
}  // namespace pscluster

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pscluster::Main();
}
