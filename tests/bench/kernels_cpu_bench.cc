// CPU backend benchmark: training-step throughput of the MLP (and the CNN) on the CPU backend,
// against two baselines measured in the same run:
//   * a naive reference: the same step in plain single-threaded C++ loops (no BLAS);
//   * OpenBLAS's own sgemm rate (its own threads) on exactly the step's GEMMs, which gives the
//     GEMM-bound limit on samples/s; the backend's fraction of that limit is reported.
// Usage: kernels_cpu_bench [--threads=N] [--seconds=S]   (defaults: all cores, 1.5 s per point)
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/create_backend.h"
#include "kernels/models/create_model.h"
#include "kernels/models/host_init.h"

namespace pscluster::kernels {
namespace {

double seconds_per_point = 2.0;

// Candidates of one comparison are timed in interleaved rounds (A B C A B C ...), so a change
// of load on a shared machine hits all of them alike; each gets the median of its rounds.
struct Candidate {
  std::string name;
  std::function<void()> fn;
  std::function<void()> after;  // Runs after each of its rounds (untimed), may be empty.
  double seconds_per_call = 0;
};

void MeasureInterleaved(std::vector<Candidate>* candidates) {
  auto now = [] { return std::chrono::steady_clock::now(); };
  constexpr int kRounds = 7;
  const double slice = seconds_per_point / kRounds;
  std::vector<int> reps;
  for (Candidate& c : *candidates) {
    c.fn();  // Warm-up: allocations, page faults, lazy initialisation.
    const auto t0 = now();
    c.fn();
    const double once = std::chrono::duration<double>(now() - t0).count();
    reps.push_back(std::max(1, static_cast<int>(slice / std::max(once, 1e-7))));
    if (c.after) c.after();
  }
  std::vector<std::vector<double>> times(candidates->size());
  for (int r = 0; r < kRounds; ++r) {
    for (size_t i = 0; i < candidates->size(); ++i) {
      Candidate& c = (*candidates)[i];
      const auto t0 = now();
      for (int k = 0; k < reps[i]; ++k) c.fn();
      times[i].push_back(std::chrono::duration<double>(now() - t0).count() / reps[i]);
      if (c.after) c.after();
    }
  }
  for (size_t i = 0; i < candidates->size(); ++i) {
    std::sort(times[i].begin(), times[i].end());
    (*candidates)[i].seconds_per_call = times[i][kRounds / 2];
  }
}

// OpenBLAS's own threads spin for a while after a threaded call; let them go to sleep before
// the next candidate runs.
void LetOpenBlasThreadsSleep() { std::this_thread::sleep_for(std::chrono::milliseconds(150)); }

struct Gemm {
  bool ta, tb;
  int m, n, k;
};

// The GEMMs of one MLP training step (forward, weight gradient, input gradient but the first).
std::vector<Gemm> MlpGemms(int batch, const std::vector<int>& widths) {
  std::vector<Gemm> g;
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    const int in = widths[l], out = widths[l + 1];
    g.push_back({false, false, batch, out, in});   // y = x W
    g.push_back({true, false, in, out, batch});    // dW = x^T dy
    if (l > 0) g.push_back({false, true, batch, in, out});  // dx = dy W^T
  }
  return g;
}

double Flops(const std::vector<Gemm>& gemms) {
  double f = 0;
  for (const Gemm& g : gemms) f += 2.0 * g.m * g.n * g.k;
  return f;
}

// One pass over `gemms` with cblas_sgemm on OpenBLAS's own `threads` threads.
Candidate OpenBlasCandidate(const std::vector<Gemm>& gemms, int threads) {
  size_t most = 0;
  for (const Gemm& g : gemms) {
    most = std::max<size_t>({most, size_t(g.m) * g.k, size_t(g.k) * g.n, size_t(g.m) * g.n});
  }
  auto a = std::make_shared<std::vector<float>>(most, 0.5f);
  auto b = std::make_shared<std::vector<float>>(most, 0.25f);
  auto c = std::make_shared<std::vector<float>>(most);
  Candidate cand;
  cand.name = absl::StrCat("OpenBLAS sgemm, ", threads, " threads");
  cand.fn = [=] {
    openblas_set_num_threads(threads);
    for (const Gemm& g : gemms) {
      cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans,
                  g.m, g.n, g.k, 1.0f, a->data(), g.ta ? g.m : g.k, b->data(), g.tb ? g.k : g.n,
                  0.0f, c->data(), g.n);
    }
  };
  cand.after = [threads] {
    openblas_set_num_threads(1);
    if (threads > 1) LetOpenBlasThreadsSleep();
  };
  return cand;
}

// ---- The naive reference: one MLP (ReLU) training step in plain loops, one thread. ----
class NaiveMlp {
 public:
  NaiveMlp(int batch, std::vector<int> widths, std::mt19937_64& rng)
      : batch_(batch), widths_(std::move(widths)) {
    std::normal_distribution<float> normal(0.0f, 0.05f);
    for (size_t l = 0; l + 1 < widths_.size(); ++l) {
      w_.emplace_back(size_t(widths_[l]) * widths_[l + 1]);
      for (float& v : w_.back()) v = normal(rng);
      b_.emplace_back(widths_[l + 1], 0.0f);
      dw_.emplace_back(w_.back().size());
      db_.emplace_back(b_.back().size());
    }
    for (int w : widths_) act_.emplace_back(size_t(batch) * w);
    grad_.resize(act_.size());
    for (size_t i = 0; i < act_.size(); ++i) grad_[i].resize(act_[i].size());
  }

  float Step(const float* x, const int32_t* labels) {
    const int layers = static_cast<int>(w_.size());
    std::copy_n(x, act_[0].size(), act_[0].begin());
    for (int l = 0; l < layers; ++l) {
      const int in = widths_[l], out = widths_[l + 1];
      float* y = act_[l + 1].data();
      for (int i = 0; i < batch_; ++i) {
        float* yi = y + size_t(i) * out;
        for (int j = 0; j < out; ++j) yi[j] = b_[l][j];
        for (int k = 0; k < in; ++k) {
          const float xv = act_[l][size_t(i) * in + k];
          const float* wk = w_[l].data() + size_t(k) * out;
          for (int j = 0; j < out; ++j) yi[j] += xv * wk[j];
        }
        if (l + 1 < layers) {
          for (int j = 0; j < out; ++j) yi[j] = yi[j] < 0 ? 0 : yi[j];
        }
      }
    }
    // Softmax cross-entropy; gradient of the mean loss.
    const int classes = widths_.back();
    float loss = 0;
    for (int i = 0; i < batch_; ++i) {
      const float* z = act_[layers].data() + size_t(i) * classes;
      float* d = grad_[layers].data() + size_t(i) * classes;
      const float mx = *std::max_element(z, z + classes);
      float sum = 0;
      for (int j = 0; j < classes; ++j) sum += std::exp(z[j] - mx);
      loss += std::log(sum) - (z[labels[i]] - mx);
      for (int j = 0; j < classes; ++j) d[j] = std::exp(z[j] - mx) / sum / batch_;
      d[labels[i]] -= 1.0f / batch_;
    }
    for (int l = layers - 1; l >= 0; --l) {
      const int in = widths_[l], out = widths_[l + 1];
      const float* dy = grad_[l + 1].data();
      const float* xin = act_[l].data();
      std::fill(dw_[l].begin(), dw_[l].end(), 0.0f);
      std::fill(db_[l].begin(), db_[l].end(), 0.0f);
      for (int i = 0; i < batch_; ++i) {
        const float* dyi = dy + size_t(i) * out;
        for (int j = 0; j < out; ++j) db_[l][j] += dyi[j];
        for (int k = 0; k < in; ++k) {
          const float xv = xin[size_t(i) * in + k];
          float* dwk = dw_[l].data() + size_t(k) * out;
          for (int j = 0; j < out; ++j) dwk[j] += xv * dyi[j];
        }
      }
      if (l == 0) break;
      float* dx = grad_[l].data();
      for (int i = 0; i < batch_; ++i) {
        const float* dyi = dy + size_t(i) * out;
        for (int k = 0; k < in; ++k) {
          const float* wk = w_[l].data() + size_t(k) * out;
          float s = 0;
          for (int j = 0; j < out; ++j) s += dyi[j] * wk[j];
          // ReLU backward through the previous layer's output.
          dx[size_t(i) * in + k] = xin[size_t(i) * in + k] > 0 ? s : 0;
        }
      }
    }
    return loss / batch_;
  }

 private:
  int batch_;
  std::vector<int> widths_;
  std::vector<std::vector<float>> w_, b_, dw_, db_, act_, grad_;
};

// Model::TrainStep on `backend` (host parameters in, host gradients out), one batch per call.
Candidate BackendCandidate(const std::string& name, Backend* backend, const v1::ModelSpec& spec,
                           int batch, std::mt19937_64& rng) {
  auto model = CreateModel(spec, backend);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    std::exit(1);
  }
  struct State {
    std::unique_ptr<Model> model;
    std::unique_ptr<HostParams> host;
    std::vector<float> x;
    std::vector<int32_t> y;
    Batch batch;
    ParamValues values;
    Gradients grads;
  };
  auto st = std::make_shared<State>();
  st->model = std::move(*model);
  st->host = std::make_unique<HostParams>(*st->model);
  st->x.resize(size_t(batch) * spec.input_dim());
  std::normal_distribution<float> normal;
  for (float& v : st->x) v = normal(rng);
  for (int i = 0; i < batch; ++i) st->y.push_back(i % spec.num_classes());
  st->batch.num_examples = batch;
  st->batch.dense = st->x;
  st->batch.labels = st->y;
  st->values = *st->host->Gather(*st->model->SparseKeys(st->batch));
  st->grads = st->host->GradientBuffers();
  Candidate c;
  c.name = name;
  c.fn = [st] {
    StepResult r;
    absl::Status s = st->model->TrainStep(st->batch, st->values, st->grads, &r);
    if (!s.ok()) {
      std::fprintf(stderr, "TrainStep: %s\n", s.ToString().c_str());
      std::exit(1);
    }
  };
  return c;
}

v1::ModelSpec MlpSpec(const std::vector<int>& widths) {
  v1::ModelSpec s;
  s.set_kind("mlp");
  s.set_input_dim(widths.front());
  s.set_num_classes(widths.back());
  for (size_t i = 1; i + 1 < widths.size(); ++i) s.add_hidden(widths[i]);
  return s;
}

int Main(int argc, char** argv) {
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) threads = std::atoi(argv[i] + 10);
    if (std::strncmp(argv[i], "--seconds=", 10) == 0) seconds_per_point = std::atof(argv[i] + 10);
  }
  std::mt19937_64 rng(1);
  BackendOptions one, all;
  one.cpu_threads = 1;
  all.cpu_threads = threads;
  auto cpu1 = CreateBackend("cpu", one);
  auto cpun = CreateBackend("cpu", all);
  if (!cpu1.ok() || !cpun.ok()) return 1;
  std::printf("machine: %u hardware threads; backend: %s\n", std::thread::hardware_concurrency(),
              (*cpun)->name().c_str());

  // OpenBLAS alone, a large square GEMM, for scale.
  {
    const std::vector<Gemm> square = {{false, false, 1024, 1024, 1024}};
    std::vector<Candidate> c = {OpenBlasCandidate(square, 1), OpenBlasCandidate(square, threads)};
    MeasureInterleaved(&c);
    std::printf("OpenBLAS sgemm 1024^3: %.1f GFLOP/s on 1 thread, %.1f GFLOP/s on %d threads\n\n",
                Flops(square) / c[0].seconds_per_call / 1e9,
                Flops(square) / c[1].seconds_per_call / 1e9, threads);
  }

  std::printf("| model | batch | GEMM MFLOP/sample | naive, 1 thread | backend, 1 thread | "
              "backend, %d threads | backend vs naive | OpenBLAS sgemm on the step's GEMMs, %d "
              "threads | GEMM-bound limit | backend / limit |\n",
              threads, threads);
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  const std::vector<std::vector<int>> mlps = {{784, 256, 10}, {784, 512, 256, 10}};
  for (const auto& widths : mlps) {
    for (int batch : {64, 256}) {
      const std::vector<Gemm> gemms = MlpGemms(batch, widths);
      const double flops = Flops(gemms);
      auto naive = std::make_shared<NaiveMlp>(batch, widths, rng);
      auto x = std::make_shared<std::vector<float>>(size_t(batch) * widths[0]);
      std::normal_distribution<float> normal;
      for (float& v : *x) v = normal(rng);
      auto y = std::make_shared<std::vector<int32_t>>(batch);
      for (int i = 0; i < batch; ++i) (*y)[i] = i % widths.back();
      std::vector<Candidate> c = {
          OpenBlasCandidate(gemms, threads),
          {"naive", [=] { naive->Step(x->data(), y->data()); }, nullptr, 0},
          BackendCandidate("backend 1", cpu1->get(), MlpSpec(widths), batch, rng),
          BackendCandidate("backend n", cpun->get(), MlpSpec(widths), batch, rng),
      };
      MeasureInterleaved(&c);
      const double limit = batch / c[0].seconds_per_call;
      const double naive_sps = batch / c[1].seconds_per_call;
      const double b1 = batch / c[2].seconds_per_call;
      const double bn = batch / c[3].seconds_per_call;
      std::printf("| MLP %s | %d | %.2f | %.0f samples/s | %.0f samples/s | %.0f samples/s | "
                  "%.1fx | %.1f GFLOP/s | %.0f samples/s | %.2f |\n",
                  absl::StrJoin(widths, "-").c_str(), batch, flops / batch / 1e6, naive_sps, b1,
                  bn, bn / naive_sps, flops / c[0].seconds_per_call / 1e9, limit, bn / limit);
      std::fflush(stdout);
    }
  }
  // The CNN, for reference (no naive baseline).
  {
    v1::ModelSpec cnn;
    cnn.set_kind("cnn");
    cnn.set_input_dim(784);
    cnn.set_num_classes(10);
    std::vector<Candidate> c = {BackendCandidate("cnn 1", cpu1->get(), cnn, 64, rng),
                                BackendCandidate("cnn n", cpun->get(), cnn, 64, rng)};
    MeasureInterleaved(&c);
    std::printf("\nCNN (conv 5x5x16, pool, conv 5x5x32, pool, fc 128, out 10), batch 64: "
                "%.0f samples/s on 1 thread, %.0f samples/s on %d threads\n",
                64 / c[0].seconds_per_call, 64 / c[1].seconds_per_call, threads);
  }
  return 0;
}

}  // namespace
}  // namespace pscluster::kernels

int main(int argc, char** argv) { return pscluster::kernels::Main(argc, argv); }
