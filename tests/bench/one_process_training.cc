#include "tests/bench/one_process_training.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/time/clock.h"
#include "kernels/create_backend.h"
#include "kernels/models/create_model.h"
#include "kernels/models/host_init.h"
#include "server/optimizer.h"
#include "worker/batcher.h"
#include "worker/data/partition.h"

namespace pscluster::bench {

absl::StatusOr<OneProcessResult> TrainInOneProcess(const v1::JobSpec& spec,
                                                   const data::FashionMnist& fm, int cpu_threads) {
  kernels::BackendOptions bo;
  bo.cpu_threads = cpu_threads;
  auto backend = kernels::CreateBackend("cpu", bo);
  if (!backend.ok()) return backend.status();
  v1::ModelSpec ms = spec.model();
  ms.set_input_dim(784);
  ms.set_num_classes(10);
  auto model = kernels::CreateModel(ms, backend->get(), {spec.seed()});
  if (!model.ok()) return model.status();
  auto opt = ResolveOptimizer(spec.optimizer(), "optimizer");
  if (!opt.ok()) return opt.status();
  kernels::HostParams params(**model);
  const auto& infos = (*model)->params();
  std::vector<std::vector<float>> slots(infos.size());
  for (size_t i = 0; i < infos.size(); ++i) {
    size_t n = infos[i].num_elements();
    slots[i].resize(n * opt->num_slots());
    InitSlots(*opt, slots[i].data(), n);
  }
  worker::Batcher batcher(&fm.train);
  auto part = data::PartitionExamples(fm.train.n, spec.seed(), {0, 1, 0, 0});
  if (!part.ok()) return part.status();
  const int64_t batch = spec.batch_size();
  const int64_t steps = fm.train.n / batch;
  std::vector<int64_t> ids(batch);
  int64_t t = 0;
  absl::Duration compute;
  OneProcessResult result;
  result.start = absl::Now();
  for (uint32_t e = 0; e < spec.epochs(); ++e) {
    auto order = data::EpochOrder(*part, spec.seed(), e, 0);
    for (int64_t s = 0; s < steps; ++s) {
      std::copy(order.begin() + s * batch, order.begin() + (s + 1) * batch, ids.begin());
      kernels::Batch b = batcher.Make(ids);
      auto values = params.Gather(std::vector<std::vector<uint64_t>>(infos.size()));
      if (!values.ok()) return values.status();
      kernels::Gradients grads = params.GradientBuffers();
      kernels::StepResult r;
      absl::Time c0 = absl::Now();
      absl::Status st = (*model)->TrainStep(b, *values, grads, &r);
      if (!st.ok()) return st;
      compute += absl::Now() - c0;
      ++t;
      for (size_t i = 0; i < infos.size(); ++i) {
        size_t n = infos[i].num_elements();
        float* s0 = opt->num_slots() > 0 ? slots[i].data() : nullptr;
        float* s1 = opt->num_slots() > 1 ? slots[i].data() + n : nullptr;
        ApplyUpdate(*opt, t, n, grads.values[i].data(), params.dense(i).data(), s0, s1);
      }
    }
  }
  result.end = absl::Now();
  result.samples = t * batch;
  result.samples_per_sec = result.samples / absl::ToDoubleSeconds(result.end - result.start);
  result.compute_sec_per_step = t > 0 ? absl::ToDoubleSeconds(compute) / t : 0;
  worker::Batcher test(&fm.test);
  auto values = params.Gather(std::vector<std::vector<uint64_t>>(infos.size()));
  if (!values.ok()) return values.status();
  int64_t correct = 0;
  for (int64_t start = 0; start < fm.test.n; start += 1000) {
    std::vector<int64_t> ids(std::min<int64_t>(1000, fm.test.n - start));
    std::iota(ids.begin(), ids.end(), start);
    kernels::StepResult r;
    absl::Status st = (*model)->Evaluate(test.Make(ids), *values, &r);
    if (!st.ok()) return st;
    correct += r.correct;
  }
  result.test_accuracy = static_cast<double>(correct) / fm.test.n;
  return result;
}

}  // namespace pscluster::bench
