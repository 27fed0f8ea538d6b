#include "tests/bench/apply_bench.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "server/optimizer.h"
#include "server/payload.h"
#include "server/table.h"

namespace pscluster::bench {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

ApplyResult BenchApply(int runs) {
  const size_t n = 4 << 20;  // 16 MiB of gradient; weights + 2 slots: 64 MiB touched.
  v1::OptimizerSpec spec;
  spec.set_kind(v1::OptimizerSpec::ADAM);
  spec.set_learning_rate(1e-3f);
  auto p = *ResolveOptimizer(spec, "optimizer");
  std::vector<float> w(n, 0.1f), m(n, 0.f), v(n, 0.f), g(n, 1e-3f), copy(n, 0.f);
  v1::TableSpec t;
  t.set_name("t");
  t.set_kind(v1::DENSE);
  t.mutable_shape()->add_dims(n);
  t.set_block_elems(1 << 20);
  *t.mutable_optimizer() = spec;
  TableInfo info(t, p, 1);
  DenseTable table(&info);
  MemoryBudget budget(0);
  absl::Status held = table.SetHeldShards({true}, &budget);
  if (!held.ok()) {
    std::fprintf(stderr, "optimizer apply: %s\n", held.ToString().c_str());
    std::exit(1);
  }
  // As received: in 64 KiB pieces (the shape of gRPC receive slices), half of them misaligned.
  std::string bytes(reinterpret_cast<char*>(g.data()), n * 4);
  bytes.insert(bytes.begin() + (8 << 20), 'x');
  std::vector<absl::string_view> pieces;
  for (size_t off = 0; off < bytes.size(); off += 64 << 10) {
    size_t len = std::min<size_t>(64 << 10, bytes.size() - off);
    if (off == (8 << 20)) {
      pieces.emplace_back(bytes.data() + off + 1, len - 1);  // Skips the inserted byte.
    } else {
      pieces.emplace_back(bytes.data() + off, len);
    }
  }
  std::vector<double> mc, kr, tb, krr, tbr;
  for (int run = 0; run <= runs; ++run) {
    absl::Time t0 = absl::Now();
    std::memcpy(copy.data(), g.data(), n * 4);
    absl::Time t1 = absl::Now();
    ApplyUpdate(p, run + 1, n, g.data(), w.data(), m.data(), v.data());
    absl::Time t2 = absl::Now();
    for (uint64_t b = 0; b < table.num_blocks(); ++b) {
      // Each block takes its quarter of the payload.
      std::vector<absl::string_view> quarter;
      size_t begin = b * (4 << 20), end = begin + (4 << 20), at = 0;
      for (auto piece : pieces) {
        size_t lo = std::max(begin, at), hi = std::min(end, at + piece.size());
        if (lo < hi) quarter.push_back(piece.substr(lo - at, hi - lo));
        at += piece.size();
      }
      table.ApplyPayload(table.block(b), 0, 1 << 20, Payload(quarter, nullptr), v1::DT_FLOAT32);
    }
    absl::Time t3 = absl::Now();
    if (run == 0) continue;  // Warm-up.
    const double bytes_moved = n * 4.0;
    mc.push_back(bytes_moved / absl::ToDoubleSeconds(t1 - t0));
    kr.push_back(bytes_moved / absl::ToDoubleSeconds(t2 - t1));
    tb.push_back(bytes_moved / absl::ToDoubleSeconds(t3 - t2));
    krr.push_back(kr.back() / mc.back());
    tbr.push_back(tb.back() / mc.back());
  }
  return {Median(mc), Median(kr), Median(tb), Median(krr), Median(tbr)};
}

}  // namespace pscluster::bench
