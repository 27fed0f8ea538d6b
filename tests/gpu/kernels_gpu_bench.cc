// GPU check benchmark (run by tests/gpu/run_gpu_checks.sh on a machine with a CUDA device):
//   1. cuBLAS GEMM TFLOP/s: fp32, tf32 and bf16 (8192^3, random data), and fp32 through
//      Backend::Gemm;
//   2. every hand-written kernel's achieved GB/s against a device-to-device copy measured in
//      the same run (bytes = what the kernel must read plus write);
//   3. one training step (host parameters in, host gradients out) of the MLP and the CNN, with
//      float32 GEMMs, with TF32 tensor cores, and with float32 GEMMs in steps replayed as CUDA
//      Graphs, as "STEP <model> <batch> <fp32|tf32|fp32+graphs> <ms>" lines that the script sets
//      against PyTorch's (which has no graphs row).
// Row ops run on uniform and on Zipf-distributed rows (hot rows: atomics contend).
// Without a usable device it prints "SKIPPED: ..." and exits 0; run_gpu_checks.sh fails a run
// whose benchmark does not print "device: cuda...".
// --probe prints the CUDA runtime, driver and cuBLAS versions and the devices, then exits.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/create_backend.h"
#include "kernels/models/create_model.h"
#include "kernels/models/graph_model.h"
#include "kernels/models/host_init.h"

#ifdef PSCLUSTER_HAVE_CUDA
#include "kernels/cuda/cuda_probe.h"
#include "tests/gpu/cublas_rates.h"
#endif

namespace pscluster::kernels {
namespace {

void Die(const absl::Status& s, const std::string& what) {
  std::fprintf(stderr, "FAILED %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

// Seconds per call of op (queued on `b`), synchronised: enough calls for >= 30 ms, median of 3.
double Time(Backend* b, const std::string& what, const std::function<absl::Status()>& op) {
  auto run = [&](int reps) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) {
      absl::Status s = op();
      if (!s.ok()) Die(s, what);
    }
    absl::Status s = b->Synchronize();
    if (!s.ok()) Die(s, what);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  run(2);  // Warm-up.
  int reps = 1;
  while (run(reps) < 0.03 && reps < (1 << 20)) reps *= 2;
  std::vector<double> t = {run(reps) / reps, run(reps) / reps, run(reps) / reps};
  std::sort(t.begin(), t.end());
  return t[1];
}

template <typename T>
T* Alloc(Backend* b, std::vector<Buffer>* keep, int64_t n, const std::string& what) {
  auto buf = b->Allocate(sizeof(T) * n);
  if (!buf.ok()) Die(buf.status(), what);
  T* p = buf->as<T>();
  keep->push_back(std::move(*buf));
  return p;
}

template <typename T>
void Upload(Backend* b, T* dst, const std::vector<T>& v) {
  absl::Status s = b->CopyToDevice(v.data(), dst, sizeof(T) * v.size());
  if (s.ok()) s = b->Synchronize();
  if (!s.ok()) Die(s, "upload");
}

// m row indices in [0, rows) with P(rank r) ~ 1 / (r + 1)^s, ranks scattered over the rows by a
// fixed permutation (so hot rows are not neighbours).
std::vector<int32_t> ZipfRows(std::mt19937_64& rng, int64_t m, int64_t rows, double s) {
  std::vector<double> cdf(rows);
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) cdf[r] = total += std::pow(static_cast<double>(r + 1), -s);
  std::vector<int32_t> perm(rows);
  for (int64_t r = 0; r < rows; ++r) perm[r] = static_cast<int32_t>(r);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::uniform_real_distribution<double> u(0.0, total);
  std::vector<int32_t> idx(m);
  for (int32_t& i : idx) {
    const int64_t rank = std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin();
    i = perm[std::min(rank, rows - 1)];
  }
  return idx;
}

void KernelTable(Backend* b) {
  std::vector<Buffer> keep;
  std::mt19937_64 rng(7);
  const int64_t n = int64_t{64} << 20;  // 64 Mi floats = 256 MiB per tensor.
  float* x = Alloc<float>(b, &keep, n, "x");
  float* y = Alloc<float>(b, &keep, n, "y");
  float* z = Alloc<float>(b, &keep, n, "z");
  {
    std::vector<float> host(n);
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < n; i += 4096) host[i] = normal(rng);  // Cheap, non-constant data.
    for (int64_t i = 0; i < n; ++i) host[i] = host[i & ~int64_t{4095}] + 1e-3f * (i & 4095);
    Upload(b, x, host);
    Upload(b, z, host);
  }
  const double copy_s =
      Time(b, "copy", [&] { return b->CopyOnDevice(x, y, sizeof(float) * n); });
  const double copy_gbs = 2.0 * sizeof(float) * n / copy_s / 1e9;
  std::printf("\n| kernel | shape | bytes moved | time | GB/s | vs device-to-device copy |\n");
  std::printf("|---|---|---|---|---|---|\n");
  auto row = [&](const std::string& name, const std::string& shape, double bytes, double s) {
    std::printf("| %s | %s | %.0f MB | %.3f ms | %.0f | %.2f |\n", name.c_str(), shape.c_str(),
                bytes / 1e6, s * 1e3, bytes / s / 1e9, bytes / s / 1e9 / copy_gbs);
    std::fflush(stdout);
  };
  row("device-to-device copy (cudaMemcpyAsync)", "64Mi floats", 8.0 * n, copy_s);
  row("Fill", "64Mi", 4.0 * n, Time(b, "Fill", [&] { return b->Fill(n, 1.0f, y); }));
  const int64_t cols = 1024, rows = n / cols;
  float* bias = Alloc<float>(b, &keep, cols, "bias");
  row("AddBias", "64Ki x 1024", 8.0 * n,
      Time(b, "AddBias", [&] { return b->AddBias(rows, cols, x, bias, y); }));
  row("ColumnSum", "64Ki x 1024", 4.0 * n,
      Time(b, "ColumnSum", [&] { return b->ColumnSum(rows, cols, x, false, bias); }));
  row("ColumnSum", "4Mi x 16", 4.0 * n,
      Time(b, "ColumnSum", [&] { return b->ColumnSum(n / 16, 16, x, false, bias); }));
  for (Activation f : {Activation::kRelu, Activation::kGelu}) {
    const std::string name = ActivationName(f);
    row(name + " forward", "64Mi", 8.0 * n,
        Time(b, name, [&] { return b->ActivationForward(f, n, x, y); }));
    row(name + " backward", "64Mi", 12.0 * n,
        Time(b, name, [&] { return b->ActivationBackward(f, n, x, z, y); }));
  }
  {
    const int64_t classes = 10, r = n / classes;
    std::vector<int32_t> labels(r);
    for (int64_t i = 0; i < r; ++i) labels[i] = static_cast<int32_t>(i % classes);
    int32_t* dl = Alloc<int32_t>(b, &keep, r, "labels");
    Upload(b, dl, labels);
    float* stats = Alloc<float>(b, &keep, 2 * r, "stats");
    row("SoftmaxCrossEntropy + gradient", "6.7Mi x 10", 8.0 * n + 12.0 * r,
        Time(b, "softmax", [&] { return b->SoftmaxCrossEntropy(r, classes, x, dl, 1.0f, y, stats); }));
  }
  {
    const int64_t width = 64, table_rows = 1 << 20, m = n / width;
    const int64_t per_bag = 32, bags = m / per_bag;
    std::vector<int32_t> offsets(bags + 1);
    for (int64_t i = 0; i <= bags; ++i) offsets[i] = static_cast<int32_t>(i * per_bag);
    int32_t* doff = Alloc<int32_t>(b, &keep, bags + 1, "offsets");
    Upload(b, doff, offsets);
    int32_t* di = Alloc<int32_t>(b, &keep, m, "idx");
    std::uniform_int_distribution<int32_t> pick(0, table_rows - 1);
    std::vector<int32_t> uniform(m);
    for (int32_t& i : uniform) i = pick(rng);
    struct Keys {
      const char* name;
      std::vector<int32_t> idx;
    };
    // Zipf s = 1.1 over 1Mi rows: the hottest row takes ~7% of the entries, the top 100 ~40%.
    for (const Keys& keys : {Keys{"uniform", uniform},
                             Keys{"Zipf 1.1", ZipfRows(rng, m, table_rows, 1.1)}}) {
      Upload(b, di, keys.idx);
      const std::string tag = std::string(" (") + keys.name + " rows)";
      row("GatherRows" + tag, "1Mi rows of 64 from 1Mi", 8.0 * n + 4.0 * m,
          Time(b, "gather", [&] { return b->GatherRows(m, width, x, table_rows, di, y); }));
      row("ScatterAddRows, atomics" + tag, "1Mi rows of 64 into 1Mi", 12.0 * n + 4.0 * m,
          Time(b, "scatter", [&] { return b->ScatterAddRows(m, width, x, di, table_rows, y); }));
      row("EmbeddingBagForward" + tag, "32Ki bags x 32 of width 64",
          4.0 * n + 8.0 * m + 4.0 * bags * width, Time(b, "bag fwd", [&] {
            return b->EmbeddingBagForward(bags, width, m, doff, di, z, x, table_rows, y);
          }));
      row("EmbeddingBagBackward, atomics" + tag, "32Ki bags x 32 of width 64",
          8.0 * n + 8.0 * m + 4.0 * bags * width, Time(b, "bag bwd", [&] {
            return b->EmbeddingBagBackward(bags, width, m, doff, di, z, x, table_rows, y);
          }));
    }
  }
  {
    auto* h = reinterpret_cast<uint16_t*>(z);
    row("CastToHalf fp16", "64Mi", 6.0 * n,
        Time(b, "to fp16", [&] { return b->CastToHalf(HalfType::kFloat16, n, x, h); }));
    row("CastFromHalf fp16", "64Mi", 6.0 * n,
        Time(b, "from fp16", [&] { return b->CastFromHalf(HalfType::kFloat16, n, h, y); }));
    row("CastToHalf bf16", "64Mi", 6.0 * n,
        Time(b, "to bf16", [&] { return b->CastToHalf(HalfType::kBFloat16, n, x, h); }));
    Upload(b, z, std::vector<float>(n, 0.5f));
  }
  {
    const int64_t m = n / 4, k = m / 100;
    int32_t* idx = Alloc<int32_t>(b, &keep, k, "topk idx");
    row("TopKAbs (6 passes over x)", "16Mi, k = 1%", 6 * 4.0 * m + 8.0 * k,
        Time(b, "topk", [&] { return b->TopKAbs(m, x, k, idx, y); }));
  }
  {
    ConvGeometry g{512, 14, 14, 16, 5, 5, 2, 2, 1};  // The CNN's second convolution.
    const double in = 4.0 * g.input_size(), cols = 4.0 * g.num_patches() * g.patch_size();
    row("Im2Col", "512 x 14x14x16, 5x5", in + cols,
        Time(b, "im2col", [&] { return b->Im2Col(g, x, y); }));
    row("Col2Im", "512 x 14x14x16, 5x5", in + cols,
        Time(b, "col2im", [&] { return b->Col2Im(g, y, z); }));
    PoolGeometry p{1024, 28, 28, 16, 2, 2};
    int32_t* am = Alloc<int32_t>(b, &keep, p.output_size(), "argmax");
    row("MaxPoolForward", "1024 x 28x28x16", 4.0 * p.input_size() + 8.0 * p.output_size(),
        Time(b, "pool fwd", [&] { return b->MaxPoolForward(p, x, y, am); }));
    row("MaxPoolBackward", "1024 x 28x28x16", 4.0 * p.input_size() + 8.0 * p.output_size(),
        Time(b, "pool bwd", [&] { return b->MaxPoolBackward(p, y, am, z); }));
  }
}

void GemmTable(Backend* b, int device) {
  std::printf("\n| cuBLAS GEMM | size | TFLOP/s |\n|---|---|---|\n");
#ifdef PSCLUSTER_HAVE_CUDA
  const struct {
    gpu_bench::GemmType type;
    const char* name;
  } kinds[] = {{gpu_bench::GemmType::kFp32, "fp32 (cublasSgemm)"},
               {gpu_bench::GemmType::kTf32, "tf32 tensor cores (cublasSgemm)"},
               {gpu_bench::GemmType::kBf16, "bf16 tensor cores (cublasGemmEx, fp32 accumulate)"}};
  for (const auto& k : kinds) {
    auto t = gpu_bench::CublasGemmTflops(k.type, 8192, 10, device);
    if (!t.ok()) Die(t.status(), k.name);
    std::printf("| %s | 8192^3 | %.1f |\n", k.name, *t);
    std::fflush(stdout);
  }
#endif
  const int64_t m = 4096;
  std::vector<Buffer> keep;
  float* a = Alloc<float>(b, &keep, m * m, "a");
  float* c = Alloc<float>(b, &keep, m * m, "c");
  absl::Status s = b->Fill(m * m, 0.01f, a);
  if (!s.ok()) Die(s, "fill");
  const double t = Time(b, "Backend::Gemm", [&] {
    return b->Gemm(Trans::kNo, Trans::kYes, m, m, m, 1.0f, a, a, 0.0f, c);
  });
  std::printf("| fp32 through Backend::Gemm (row-major, B transposed) | 4096^3 | %.1f |\n",
              2.0 * m * m * m / t / 1e12);
}

void StepTimes(Backend* b, const char* math) {
  struct Model {
    const char* name;
    v1::ModelSpec spec;
  };
  v1::ModelSpec mlp, cnn;
  mlp.set_kind("mlp");
  mlp.set_input_dim(784);
  mlp.set_num_classes(10);
  mlp.add_hidden(512);
  mlp.add_hidden(256);
  cnn.set_kind("cnn");
  cnn.set_input_dim(784);
  cnn.set_num_classes(10);
  std::printf("\n");
  for (const Model& m : {Model{"mlp", mlp}, Model{"cnn", cnn}}) {
    auto model = CreateModel(m.spec, b);
    if (!model.ok()) Die(model.status(), m.name);
    HostParams host(**model);
    for (int batch : {128, 1024}) {
      std::vector<float> x(size_t(batch) * 784);
      std::mt19937_64 rng(batch);
      std::normal_distribution<float> normal;
      for (float& v : x) v = normal(rng);
      std::vector<int32_t> y(batch);
      for (int i = 0; i < batch; ++i) y[i] = i % 10;
      Batch bt;
      bt.num_examples = batch;
      bt.dense = x;
      bt.labels = y;
      auto values = host.Gather(*(*model)->SparseKeys(bt));
      Gradients grads = host.GradientBuffers();
      const double s = Time(b, m.name, [&] {
        StepResult r;
        return (*model)->TrainStep(bt, *values, grads, &r);
      });
      std::printf("STEP %s %d %s %.4f\n", m.name, batch, math, s * 1e3);
      if (b->records_graphs()) {
        // Whether the timed steps were replays at all (a failed recording runs them op by op).
        const auto* gm = dynamic_cast<const GraphModel*>(model->get());
        std::string note = "not a graph model";
        if (gm != nullptr && gm->step_graphs().failure().ok()) {
          const StepGraphs::Stats& st = gm->step_graphs().stats();
          note = absl::StrCat(st.plain, " steps plain, ", st.captured, " recorded, ",
                              st.replayed, " replayed");
        } else if (gm != nullptr) {
          note = absl::StrCat("recording failed: ", gm->step_graphs().failure().ToString());
        }
        std::printf("%s batch %d, CUDA Graphs: %s\n", m.name, batch, note.c_str());
      }
      std::fflush(stdout);
    }
  }
}

int Probe() {
#ifdef PSCLUSTER_HAVE_CUDA
  const ::pscluster::cuda::ProbeResult p = ::pscluster::cuda::Probe();
  std::string devices = absl::StrCat(p.device_count, " device(s)");
  if (!p.device_name.empty()) absl::StrAppend(&devices, ", device 0: ", p.device_name);
  if (!p.error.empty()) absl::StrAppend(&devices, " (", p.error, ")");
  std::printf("CUDA runtime %d, driver %d, cuBLAS %d; %s\n", p.runtime_version,
              p.driver_version, p.cublas_version, devices.c_str());
  if (p.driver_version != 0 && p.driver_version < p.runtime_version) {
    std::printf("the driver (CUDA %d) is older than the runtime this was built with (%d)\n",
                p.driver_version, p.runtime_version);
  }
  return p.device_count > 0 ? 0 : 2;
#else
  std::printf("built without a CUDA toolkit\n");
  return 2;
#endif
}

int Main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--probe") return Probe();
  BackendOptions options;
  auto backend = CreateBackend("cuda", options);
  if (!backend.ok()) {
    std::printf("SKIPPED: no usable CUDA device (%s)\n", backend.status().ToString().c_str());
    return 0;
  }
  Backend* b = backend->get();
  std::printf("device: %s\n", b->name().c_str());
  GemmTable(b, options.cuda_device);
  KernelTable(b);
  StepTimes(b, "fp32");
  BackendOptions tf32 = options;
  tf32.cuda_allow_tf32 = true;
  auto tf32_backend = CreateBackend("cuda", tf32);
  if (!tf32_backend.ok()) Die(tf32_backend.status(), "TF32 backend");
  StepTimes(tf32_backend->get(), "tf32");
  BackendOptions graphs = options;
  graphs.cuda_graphs = true;
  auto graphs_backend = CreateBackend("cuda", graphs);
  if (!graphs_backend.ok()) Die(graphs_backend.status(), "CUDA Graphs backend");
  StepTimes(graphs_backend->get(), "fp32+graphs");
  return 0;
}

}  // namespace
}  // namespace pscluster::kernels

int main(int argc, char** argv) { return pscluster::kernels::Main(argc, argv); }
