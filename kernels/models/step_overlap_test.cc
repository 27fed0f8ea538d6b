// A step's copies overlapping its computation, without a GPU: the next step's parameters
// uploaded on the upload stream into a second set of device buffers (ParamPrefetch,
// Model::PrefetchParams) and each layer's gradients sent back on the download stream as
// backward finishes it. Checked through the copying backend's deferred schedules, which run the
// streams as far apart as the events allow (ops first, or copies first): results equal the CPU
// backend's bit for bit, a parameter set is never overwritten under a step that still reads it,
// no gradient is handed over before its copy has run, and a failed copy is a step's error.
#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kernels/create_backend.h"
#include "kernels/models/create_model.h"
#include "kernels/models/graph_model.h"
#include "kernels/models/model_test_util.h"
#include "kernels/models/param_prefetch.h"
#include "kernels/testing/copying_backend.h"
#include "kernels/testing/test_util.h"

namespace pscluster::kernels {
namespace {

using testing::CopyingBackend;
using Schedule = CopyingBackend::Schedule;
using LogEntry = CopyingBackend::LogEntry;

std::unique_ptr<Backend> Cpu() {
  BackendOptions options;
  options.cpu_threads = 2;
  auto b = CreateBackend("cpu", options);
  EXPECT_TRUE(b.ok()) << b.status();
  return std::move(*b);
}

const char* ScheduleName(Schedule s) {
  return s == Schedule::kOpsFirst ? "ops first" : s == Schedule::kCopiesFirst ? "copies first"
                                                                               : "eager";
}

std::vector<float> Floats(const void* p, size_t n) {
  std::vector<float> v(n);
  std::memcpy(v.data(), p, n * sizeof(float));
  return v;
}

// Index in `log` of the first (or last) entry from `from` on that matches.
template <typename F>
int64_t Find(const std::vector<LogEntry>& log, size_t from, F match, bool last = false) {
  int64_t found = -1;
  for (size_t i = from; i < log.size(); ++i) {
    if (!match(log[i])) continue;
    found = static_cast<int64_t>(i);
    if (!last) break;
  }
  return found;
}

// ---- The stand-in itself: its schedules do catch a missing wait. ----

TEST(CopyingBackendStreamsTest, OpsFirstRunsAnOpAheadOfAnUploadItDoesNotWaitFor) {
  for (bool wait : {false, true}) {
    CopyingBackend backend(Cpu(), false, Schedule::kOpsFirst);
    auto dev = backend.Allocate(16 * sizeof(float));
    auto out = backend.Allocate(16 * sizeof(float));
    auto uploaded = backend.CreateEvent();
    ASSERT_TRUE(dev.ok() && out.ok() && uploaded.ok());
    std::vector<float> host(16, 3.0f), back(16, 0.0f);
    ASSERT_TRUE(backend.CopyToDeviceAsync(host.data(), dev->data(), 64).ok());
    ASSERT_TRUE(backend.RecordEvent(Stream::kUpload, *uploaded).ok());
    if (wait) {
      ASSERT_TRUE(backend.WaitEvent(Stream::kOps, *uploaded).ok());
    }
    ASSERT_TRUE(backend.CopyOnDevice(dev->data(), out->data(), 64).ok());
    ASSERT_TRUE(backend.CopyToHost(out->data(), back.data(), 64).ok());
    EXPECT_EQ(back[0], 0.0f);  // Nothing has run before the host waits.
    ASSERT_TRUE(backend.Synchronize().ok());
    if (wait) {
      EXPECT_EQ(back, host);
    } else {
      EXPECT_NE(back[0], 3.0f);  // Read before the upload: fresh memory's garbage.
      EXPECT_EQ(backend.queued(Stream::kUpload), 2u);  // The copy and its event: not waited for.
    }
  }
}

TEST(CopyingBackendStreamsTest, CopiesFirstRunsADownloadAheadOfTheOpsItDoesNotWaitFor) {
  for (bool wait : {false, true}) {
    CopyingBackend backend(Cpu(), false, Schedule::kCopiesFirst);
    auto dev = backend.Allocate(16 * sizeof(float));
    auto computed = backend.CreateEvent();
    auto copied = backend.CreateEvent();
    ASSERT_TRUE(dev.ok() && computed.ok() && copied.ok());
    std::vector<float> back(16, 0.0f);
    ASSERT_TRUE(backend.Fill(16, 2.0f, dev->as<float>()).ok());
    ASSERT_TRUE(backend.RecordEvent(Stream::kOps, *computed).ok());
    if (wait) {
      ASSERT_TRUE(backend.WaitEvent(Stream::kDownload, *computed).ok());
    }
    ASSERT_TRUE(backend.CopyToHostAsync(dev->data(), back.data(), 64).ok());
    ASSERT_TRUE(backend.RecordEvent(Stream::kDownload, *copied).ok());
    ASSERT_TRUE(backend.WaitForEvent(*copied).ok());
    EXPECT_EQ(back[0] == 2.0f, wait);
  }
}

TEST(CopyingBackendStreamsTest, AFailedCopyIsReportedByTheHostsNextWaitOnce) {
  CopyingBackend backend(Cpu(), false, Schedule::kOpsFirst);
  backend.fail_async_copy = 1;
  auto dev = backend.Allocate(64);
  auto done = backend.CreateEvent();
  ASSERT_TRUE(dev.ok() && done.ok());
  float host[16] = {};
  ASSERT_TRUE(backend.CopyToDeviceAsync(host, dev->data(), 64).ok());
  ASSERT_TRUE(backend.CopyToDeviceAsync(host, dev->data(), 64).ok());  // Queued fine; fails later.
  ASSERT_TRUE(backend.RecordEvent(Stream::kUpload, *done).ok());
  absl::Status waited = backend.WaitForEvent(*done);
  EXPECT_EQ(waited.code(), absl::StatusCode::kInternal) << waited;
  EXPECT_NE(waited.message().find("asynchronous copy 1"), std::string::npos) << waited;
  EXPECT_TRUE(backend.WaitForEvent(*done).ok());
  EXPECT_TRUE(backend.Synchronize().ok());
}

// ---- The Backend API: checks, the CPU's defaults, capture. ----

TEST(BackendStreamsTest, TheCpuRunsAsyncCopiesAtOnceAndItsEventsAreNoOps) {
  std::unique_ptr<Backend> cpu = Cpu();
  auto e = cpu->CreateEvent();
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->valid());
  float a[4] = {1, 2, 3, 4}, b[4] = {}, c[4] = {};
  ASSERT_TRUE(cpu->CopyToDeviceAsync(a, b, sizeof(a)).ok());
  EXPECT_EQ(b[3], 4.0f);
  ASSERT_TRUE(cpu->CopyToHostAsync(b, c, sizeof(b)).ok());
  EXPECT_EQ(c[2], 3.0f);
  EXPECT_TRUE(cpu->RecordEvent(Stream::kDownload, *e).ok());
  EXPECT_TRUE(cpu->WaitEvent(Stream::kOps, *e).ok());
  EXPECT_TRUE(cpu->WaitForEvent(*e).ok());
}

TEST(BackendStreamsTest, EmptyOrForeignEventsAndNullCopiesAreInvalid) {
  std::unique_ptr<Backend> cpu = Cpu(), other = Cpu();
  auto foreign = other->CreateEvent();
  ASSERT_TRUE(foreign.ok());
  Event empty;
  float x[2] = {};
  EXPECT_EQ(cpu->RecordEvent(Stream::kOps, empty).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu->WaitForEvent(*foreign).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu->WaitEvent(Stream::kUpload, *foreign).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu->CopyToDeviceAsync(nullptr, x, 8).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu->CopyToHostAsync(x, nullptr, 8).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(cpu->CopyToHostAsync(nullptr, nullptr, 0).ok());
}

TEST(BackendStreamsTest, WhileCapturingCopyStreamsAndEventsAreRefused) {
  CopyingBackend backend(Cpu(), /*records=*/true);
  auto dev = backend.Allocate(64);
  auto e = backend.CreateEvent();
  ASSERT_TRUE(dev.ok() && e.ok());
  float host[16] = {};
  ASSERT_TRUE(backend.BeginCapture().ok());
  const auto refused = absl::StatusCode::kFailedPrecondition;
  EXPECT_EQ(backend.CreateEvent().status().code(), refused);
  EXPECT_EQ(backend.CopyToDeviceAsync(host, dev->data(), 64).code(), refused);
  EXPECT_EQ(backend.CopyToHostAsync(dev->data(), host, 64).code(), refused);
  EXPECT_EQ(backend.RecordEvent(Stream::kOps, *e).code(), refused);
  EXPECT_EQ(backend.WaitEvent(Stream::kOps, *e).code(), refused);
  EXPECT_EQ(backend.WaitForEvent(*e).code(), refused);
  ASSERT_TRUE(backend.EndCapture().ok());
  EXPECT_TRUE(backend.RecordEvent(Stream::kOps, *e).ok());
}

// ---- ParamPrefetch ----

class ParamPrefetchTest : public ::testing::TestWithParam<Schedule> {
 protected:
  ParamPrefetchTest() : backend_(Cpu(), false, GetParam()) {}

  // Host values: one small tensor (staged) and one of 80 KiB (copied directly).
  struct Values {
    std::vector<float> small, big;
    ParamPrefetch::Values spans() const { return {small, big}; }
  };
  Values Make(float base) {
    Values v;
    v.small.resize(10);
    v.big.resize(20000);
    for (size_t i = 0; i < v.small.size(); ++i) v.small[i] = base + i;
    for (size_t i = 0; i < v.big.size(); ++i) v.big[i] = base - 0.5f * i;
    return v;
  }
  // A "step": an op that copies what it reads from the device tensors into fresh buffers.
  struct Read {
    Buffer small, big;
  };
  Read Queue(const std::vector<const float*>& device) {
    Read r;
    r.small = *backend_.Allocate(10 * sizeof(float));
    r.big = *backend_.Allocate(20000 * sizeof(float));
    EXPECT_TRUE(backend_.CopyOnDevice(device[0], r.small.data(), 10 * sizeof(float)).ok());
    EXPECT_TRUE(backend_.CopyOnDevice(device[1], r.big.data(), 20000 * sizeof(float)).ok());
    return r;
  }

  CopyingBackend backend_;
};

TEST_P(ParamPrefetchTest, AStepReadsTheUploadOnlyWhenItIsTheSameMemory) {
  ParamPrefetch prefetch(&backend_);
  Values a = Make(1.0f), copy = a;
  ASSERT_TRUE(prefetch.Prefetch(a.spans()).ok());
  EXPECT_TRUE(prefetch.pending());
  std::vector<const float*> device;
  auto took = prefetch.Take(copy.spans(), &device);  // Equal values, other memory: not these.
  ASSERT_TRUE(took.ok());
  EXPECT_FALSE(*took);
  ParamPrefetch::Values shorter = {a.small, absl::MakeConstSpan(a.big).subspan(1)};
  took = prefetch.Take(shorter, &device);
  ASSERT_TRUE(took.ok());
  EXPECT_FALSE(*took);
  EXPECT_TRUE(prefetch.pending());
  took = prefetch.Take(a.spans(), &device);
  ASSERT_TRUE(took.ok());
  ASSERT_TRUE(*took);
  EXPECT_FALSE(prefetch.pending());
  Read r = Queue(device);
  ASSERT_TRUE(prefetch.Release().ok());
  ASSERT_TRUE(backend_.Synchronize().ok());
  EXPECT_EQ(Floats(r.small.data(), 10), a.small);
  EXPECT_EQ(Floats(r.big.data(), 20000), a.big);
  EXPECT_EQ(prefetch.taken(), 1);
  EXPECT_EQ(backend_.async_to_device, 2);  // The small tensor staged, the big one directly.
}

TEST_P(ParamPrefetchTest, ASetIsNotOverwrittenWhileAQueuedStepStillReadsIt) {
  ParamPrefetch prefetch(&backend_);
  Values v[3] = {Make(1.0f), Make(100.0f), Make(-50.0f)};
  std::vector<const float*> device[3];
  std::deque<Read> reads;
  const size_t start = backend_.log.size();
  // Three steps queued back to back with no host wait between them: the third upload goes into
  // the first step's set while that step's reads may still be queued.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(prefetch.Prefetch(v[i].spans()).ok());
    auto took = prefetch.Take(v[i].spans(), &device[i]);
    ASSERT_TRUE(took.ok() && *took);
    reads.push_back(Queue(device[i]));
    ASSERT_TRUE(prefetch.Release().ok());
  }
  EXPECT_EQ(device[2][1], device[0][1]);  // Two sets, used in turn.
  EXPECT_NE(device[1][1], device[0][1]);
  ASSERT_TRUE(backend_.Synchronize().ok());
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(absl::StrCat("step ", i));
    EXPECT_EQ(Floats(reads[i].small.data(), 10), v[i].small);
    EXPECT_EQ(Floats(reads[i].big.data(), 20000), v[i].big);
  }
  // The op that read step 0's big tensor ran before the upload that overwrote it.
  const std::vector<LogEntry>& log = backend_.log;
  const int64_t read0 = Find(log, start, [&](const LogEntry& e) {
    return e.stream == Stream::kOps && e.kind == LogEntry::kCopy && e.src == device[0][1];
  });
  const int64_t write2 = Find(
      log, start,
      [&](const LogEntry& e) {
        return e.stream == Stream::kUpload && e.kind == LogEntry::kCopy && e.dst == device[0][1];
      },
      /*last=*/true);
  ASSERT_GE(read0, 0);
  ASSERT_GE(write2, 0);
  EXPECT_LT(read0, write2);
}

TEST_P(ParamPrefetchTest, ANewPrefetchReplacesOneNoStepTook) {
  ParamPrefetch prefetch(&backend_);
  Values a = Make(1.0f), b = Make(7.0f);
  ASSERT_TRUE(prefetch.Prefetch(a.spans()).ok());
  ASSERT_TRUE(prefetch.Prefetch(b.spans()).ok());
  std::vector<const float*> device;
  auto took = prefetch.Take(a.spans(), &device);
  ASSERT_TRUE(took.ok());
  EXPECT_FALSE(*took);
  took = prefetch.Take(b.spans(), &device);
  ASSERT_TRUE(took.ok() && *took);
  Read r = Queue(device);
  ASSERT_TRUE(prefetch.Release().ok());
  ASSERT_TRUE(backend_.Synchronize().ok());
  EXPECT_EQ(Floats(r.big.data(), 20000), b.big);
  EXPECT_EQ(prefetch.prefetched(), 2);
}

TEST(ParamPrefetchCpuTest, NothingIsUploadedWhereTheBackendSharesHostMemory) {
  std::unique_ptr<Backend> cpu = Cpu();
  ParamPrefetch prefetch(cpu.get());
  std::vector<float> x(8, 1.0f);
  ASSERT_TRUE(prefetch.Prefetch({x}).ok());
  EXPECT_FALSE(prefetch.pending());
  std::vector<const float*> device;
  auto took = prefetch.Take({x}, &device);
  ASSERT_TRUE(took.ok());
  EXPECT_FALSE(*took);
}

INSTANTIATE_TEST_SUITE_P(Schedules, ParamPrefetchTest,
                         ::testing::Values(Schedule::kOpsFirst, Schedule::kCopiesFirst),
                         [](const auto& info) {
                           return info.param == Schedule::kOpsFirst ? "OpsFirst" : "CopiesFirst";
                         });

// ---- Models: steps overlapped as a worker runs them ----

using testing::BatchFor;
using testing::ModelCase;

constexpr uint64_t kFieldSize = 50;

std::vector<ModelCase> Cases() {
  return {
      {testing::Spec("mlp", 64, 10, {32, 16}, "relu"), 64, 0, 10},
      {testing::Spec("cnn", 64, 10, {16}, "relu", 0, {4, 8}), 64, 0, 10},
      {testing::WideDeepGraph(5, 6, kFieldSize, 4, "gelu"), 5, 6, 2, kFieldSize},
      {testing::Spec("sparse_linear", 0, 2, {8}, "relu", 4), 0, 0, 2, 0, 300, 6},
  };
}

// One step's inputs, made ahead (a worker's next slot is pulled while the step computes).
struct StepInputs {
  testing::OwnedBatch batch;
  std::unique_ptr<testing::OwnedParams> params;
};

std::deque<StepInputs> MakeSteps(const Model& model, const ModelCase& c, std::mt19937_64& rng,
                                 const std::vector<int64_t>& sizes) {
  std::deque<StepInputs> steps;
  for (int64_t n : sizes) {
    StepInputs s;
    s.batch = BatchFor(c, rng, n);
    auto keys = model.SparseKeys(s.batch.view());
    EXPECT_TRUE(keys.ok()) << keys.status();
    s.params = std::make_unique<testing::OwnedParams>(model, *keys, rng, 0.1f);
    steps.push_back(std::move(s));
  }
  return steps;
}

struct Param {
  Schedule schedule;
  bool records;
};

class StepOverlapTest : public ::testing::TestWithParam<Param> {};

// Each step as a worker overlaps it: start step i, prefetch step i+1's parameters, finish step
// i; an evaluation with other parameters in between leaves the prefetch for its step. Every
// loss, count and gradient equals the CPU backend's plain TrainStep bit for bit; every step but
// the first (and the one after a step that prefetched nothing) read prefetched parameters; each
// gradient's copy had run when FinishStep returned, and nothing is left on the download stream.
TEST_P(StepOverlapTest, OverlappedStepsGiveTheCpuResultsBitForBit) {
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed, ", ", ScheduleName(GetParam().schedule),
                            GetParam().records ? ", recording graphs" : ""));
  std::mt19937_64 rng(seed);
  for (const ModelCase& c : Cases()) {
    SCOPED_TRACE(c.spec.ShortDebugString());
    std::unique_ptr<Backend> cpu = Cpu();
    CopyingBackend device(Cpu(), GetParam().records, GetParam().schedule);
    auto reference = CreateModel(c.spec, cpu.get());
    auto overlapped = CreateModel(c.spec, &device);
    ASSERT_TRUE(reference.ok() && overlapped.ok()) << reference.status() << overlapped.status();
    const std::vector<int64_t> sizes = {16, 16, 16, 5, 16, 16, 40, 16, 16};
    std::deque<StepInputs> steps = MakeSteps(**reference, c, rng, sizes);
    const size_t num_params = (*reference)->params().size();
    for (size_t i = 0; i < steps.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("step ", i));
      StepInputs& s = steps[i];
      testing::OwnedParams want = *s.params;
      StepResult rw, rg;
      ASSERT_TRUE((*reference)->TrainStep(s.batch.view(), want.view(), want.grad_view(), &rw).ok());
      for (auto& g : s.params->grads) std::fill(g.begin(), g.end(), testing::PoisonFloat());
      const size_t from = device.log.size();
      ASSERT_TRUE(
          (*overlapped)->StartTrainStep(s.batch.view(), s.params->view(), s.params->grad_view())
              .ok());
      if (i + 1 < steps.size()) {
        ASSERT_TRUE((*overlapped)->PrefetchParams(steps[i + 1].params->view()).ok());
      }
      absl::Status finished = (*overlapped)->FinishStep(&rg);
      ASSERT_TRUE(finished.ok()) << finished;
      EXPECT_EQ(rg.loss, rw.loss);
      EXPECT_EQ(rg.correct, rw.correct);
      EXPECT_EQ(rg.examples, rw.examples);
      for (size_t p = 0; p < num_params; ++p) {
        const std::string& name = (*reference)->params()[p].name;
        ASSERT_EQ(s.params->grads[p], want.grads[p]) << name;
        if (want.grads[p].empty()) continue;
        const void* host = s.params->grads[p].data();
        EXPECT_GE(Find(device.log, from,
                       [&](const LogEntry& e) {
                         return e.stream == Stream::kDownload && e.kind == LogEntry::kCopy &&
                                e.dst == host;
                       }),
                  0)
            << name << ": handed over before its copy ran";
      }
      EXPECT_EQ(device.queued(Stream::kDownload), 0u);
      if (i == 3) {
        // An evaluation with parameters of its own between two steps.
        testing::OwnedParams other = *s.params;
        StepResult ea, eb;
        ASSERT_TRUE((*reference)->Evaluate(s.batch.view(), other.view(), &ea).ok());
        ASSERT_TRUE((*overlapped)->Evaluate(s.batch.view(), other.view(), &eb).ok());
        EXPECT_EQ(eb.loss, ea.loss);
        EXPECT_EQ(eb.correct, ea.correct);
      }
    }
    const auto* model = dynamic_cast<const GraphModel*>(overlapped->get());
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(model->param_prefetch().prefetched(), static_cast<int64_t>(steps.size()) - 1);
    EXPECT_EQ(model->param_prefetch().taken(), static_cast<int64_t>(steps.size()) - 1);
    if (GetParam().records) {
      EXPECT_TRUE(model->step_graphs().failure().ok()) << model->step_graphs().failure();
      if (c.dense > 0 && c.fields == 0) {
        EXPECT_GT(model->step_graphs().stats().replayed, 0);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, StepOverlapTest,
    ::testing::Values(Param{Schedule::kOpsFirst, false}, Param{Schedule::kCopiesFirst, false},
                      Param{Schedule::kOpsFirst, true}, Param{Schedule::kCopiesFirst, true},
                      Param{Schedule::kEager, false}),
    [](const auto& info) {
      const Param& p = info.param;
      return absl::StrCat(p.schedule == Schedule::kOpsFirst      ? "OpsFirst"
                          : p.schedule == Schedule::kCopiesFirst ? "CopiesFirst"
                                                                 : "Eager",
                          p.records ? "Recording" : "");
    });

// With copies run as early as the events allow, the first gradients are on their way back
// while backward still computes the earlier layers': the download of the output layer's
// gradients runs before the op stream's last op of the step. Recorded steps hold no events, so
// there every gradient goes back after the step's ops.
TEST(StepOverlapLayersTest, GradientsGoBackLayerByLayerUnlessTheStepIsRecorded) {
  std::mt19937_64 rng(11);
  const ModelCase c = {testing::Spec("mlp", 32, 4, {24, 16, 8}, "relu"), 32, 0, 4};
  for (bool records : {false, true}) {
    SCOPED_TRACE(records ? "recording" : "plain");
    CopyingBackend device(Cpu(), records, Schedule::kCopiesFirst);
    auto model = CreateModel(c.spec, &device);
    ASSERT_TRUE(model.ok());
    std::deque<StepInputs> steps = MakeSteps(**model, c, rng, {8, 8, 8, 8});
    for (StepInputs& s : steps) {
      const size_t from = device.log.size();
      StepResult r;
      ASSERT_TRUE((*model)->TrainStep(s.batch.view(), s.params->view(), s.params->grad_view(),
                                      &r)
                      .ok());
      auto is_download = [](const LogEntry& e) {
        return e.stream == Stream::kDownload && e.kind == LogEntry::kCopy;
      };
      auto is_op = [](const LogEntry& e) {
        return e.stream == Stream::kOps && e.kind == LogEntry::kOp;
      };
      const int64_t first_download = Find(device.log, from, is_download);
      const int64_t last_op = Find(device.log, from, is_op, /*last=*/true);
      int64_t downloads = 0;
      for (size_t i = from; i < device.log.size(); ++i) downloads += is_download(device.log[i]);
      ASSERT_GE(first_download, 0);
      EXPECT_EQ(downloads, static_cast<int64_t>((*model)->params().size()));
      const float* out_weight = s.params->grads[6].data();  // out/weight: backward's first.
      ASSERT_EQ((*model)->params()[6].name, "out/weight");
      const int64_t out_download = Find(device.log, from, [&](const LogEntry& e) {
        return is_download(e) && e.dst == out_weight;
      });
      if (records) {
        EXPECT_GT(first_download, last_op);
      } else {
        EXPECT_LT(out_download, last_op);
        EXPECT_EQ(first_download, out_download);
      }
    }
  }
}

// ModelOptions::layer_gradient_copies false: the gradients come back with the step's other
// outputs (the op stream's download after its ops); prefetched parameters work the same.
TEST(StepOverlapLayersTest, WithoutLayerCopiesGradientsComeBackWithTheStepsOutputs) {
  std::mt19937_64 rng(12);
  const ModelCase c = Cases()[0];
  std::unique_ptr<Backend> cpu = Cpu();
  CopyingBackend device(Cpu(), false, Schedule::kCopiesFirst);
  ModelOptions options;
  options.layer_gradient_copies = false;
  auto reference = CreateModel(c.spec, cpu.get());
  auto model = CreateModel(c.spec, &device, options);
  ASSERT_TRUE(reference.ok() && model.ok());
  std::deque<StepInputs> steps = MakeSteps(**model, c, rng, {8, 8, 8});
  for (size_t i = 0; i < steps.size(); ++i) {
    testing::OwnedParams want = *steps[i].params;
    StepResult rw, r;
    ASSERT_TRUE(
        (*reference)->TrainStep(steps[i].batch.view(), want.view(), want.grad_view(), &rw).ok());
    ASSERT_TRUE((*model)
                    ->StartTrainStep(steps[i].batch.view(), steps[i].params->view(),
                                     steps[i].params->grad_view())
                    .ok());
    if (i + 1 < steps.size()) {
      ASSERT_TRUE((*model)->PrefetchParams(steps[i + 1].params->view()).ok());
    }
    ASSERT_TRUE((*model)->FinishStep(&r).ok());
    EXPECT_EQ(r.loss, rw.loss);
    EXPECT_EQ(steps[i].params->grads, want.grads);
  }
  EXPECT_EQ(device.async_to_host, 0);
  EXPECT_GT(device.async_to_device, 0);
}

// A gradient copy that fails is the step's error; the next step runs cleanly.
TEST(StepOverlapErrorsTest, AFailedGradientCopyIsTheStepsError) {
  std::mt19937_64 rng(5);
  const ModelCase c = Cases()[0];
  for (Schedule schedule : {Schedule::kOpsFirst, Schedule::kCopiesFirst}) {
    SCOPED_TRACE(ScheduleName(schedule));
    std::unique_ptr<Backend> cpu = Cpu();
    CopyingBackend device(Cpu(), false, schedule);
    auto reference = CreateModel(c.spec, cpu.get());
    auto model = CreateModel(c.spec, &device);
    ASSERT_TRUE(reference.ok() && model.ok());
    std::deque<StepInputs> steps = MakeSteps(**model, c, rng, {8, 8});
    // The step's third asynchronous copy: a gradient's (nothing was prefetched).
    device.fail_async_copy = device.async_to_device + device.async_to_host + 2;
    StepResult r;
    absl::Status failed =
        (*model)->TrainStep(steps[0].batch.view(), steps[0].params->view(),
                            steps[0].params->grad_view(), &r);
    EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
    EXPECT_NE(failed.message().find("asynchronous copy"), std::string::npos) << failed;
    testing::OwnedParams want = *steps[1].params;
    StepResult rw;
    ASSERT_TRUE((*reference)
                    ->TrainStep(steps[1].batch.view(), want.view(), want.grad_view(), &rw)
                    .ok());
    ASSERT_TRUE((*model)
                    ->TrainStep(steps[1].batch.view(), steps[1].params->view(),
                                steps[1].params->grad_view(), &r)
                    .ok());
    EXPECT_EQ(r.loss, rw.loss);
    EXPECT_EQ(steps[1].params->grads, want.grads);
  }
}

// A prefetch whose upload fails: the error is the status of the step in flight or of the step
// that would have used it (whichever waits first after the copy ran), never lost, and no step
// computes with what the failed upload left; the steps after it run cleanly.
TEST(StepOverlapErrorsTest, AFailedPrefetchIsAStepsErrorAndIsNotUsed) {
  std::mt19937_64 rng(6);
  const ModelCase c = Cases()[0];
  for (Schedule schedule : {Schedule::kOpsFirst, Schedule::kCopiesFirst}) {
    SCOPED_TRACE(ScheduleName(schedule));
    std::unique_ptr<Backend> cpu = Cpu();
    CopyingBackend device(Cpu(), false, schedule);
    auto reference = CreateModel(c.spec, cpu.get());
    auto model = CreateModel(c.spec, &device);
    ASSERT_TRUE(reference.ok() && model.ok());
    std::deque<StepInputs> steps = MakeSteps(**model, c, rng, {8, 8, 8});
    std::vector<absl::Status> status(3);
    std::vector<StepResult> results(3);
    for (int i = 0; i < 3; ++i) {
      StepInputs& s = steps[i];
      status[i] = (*model)->StartTrainStep(s.batch.view(), s.params->view(), s.params->grad_view());
      if (i == 0) {
        // The prefetch's first copy fails when it runs.
        device.fail_async_copy = device.async_to_device + device.async_to_host;
        ASSERT_TRUE((*model)->PrefetchParams(steps[1].params->view()).ok());
      }
      if (status[i].ok()) status[i] = (*model)->FinishStep(&results[i]);
    }
    EXPECT_TRUE(status[0].ok() != status[1].ok()) << status[0] << " / " << status[1];
    for (int i = 0; i < 3; ++i) {
      SCOPED_TRACE(absl::StrCat("step ", i));
      if (!status[i].ok()) {
        EXPECT_EQ(status[i].code(), absl::StatusCode::kInternal) << status[i];
        EXPECT_NE(status[i].message().find("asynchronous copy"), std::string::npos);
        continue;
      }
      testing::OwnedParams want = *steps[i].params;
      StepResult rw;
      ASSERT_TRUE((*reference)
                      ->TrainStep(steps[i].batch.view(), want.view(), want.grad_view(), &rw)
                      .ok());
      EXPECT_EQ(results[i].loss, rw.loss);
      EXPECT_EQ(steps[i].params->grads, want.grads);
    }
    // Taken only by a step that then failed.
    const auto* graph = dynamic_cast<const GraphModel*>(model->get());
    EXPECT_EQ(graph->param_prefetch().taken(), status[1].ok() ? 0 : 1);
  }
}

TEST(StepOverlapStateTest, OneStepIsInFlightAtATime) {
  std::mt19937_64 rng(7);
  const ModelCase c = Cases()[0];
  CopyingBackend device(Cpu(), false, Schedule::kOpsFirst);
  auto model = CreateModel(c.spec, &device);
  ASSERT_TRUE(model.ok());
  std::deque<StepInputs> steps = MakeSteps(**model, c, rng, {8});
  StepInputs& s = steps[0];
  StepResult r;
  const auto refused = absl::StatusCode::kFailedPrecondition;
  EXPECT_EQ((*model)->FinishStep(&r).code(), refused);
  ASSERT_TRUE(
      (*model)->StartTrainStep(s.batch.view(), s.params->view(), s.params->grad_view()).ok());
  EXPECT_EQ(
      (*model)->StartTrainStep(s.batch.view(), s.params->view(), s.params->grad_view()).code(),
      refused);
  EXPECT_EQ((*model)->TrainStep(s.batch.view(), s.params->view(), s.params->grad_view(), &r).code(),
            refused);
  EXPECT_EQ((*model)->Evaluate(s.batch.view(), s.params->view(), &r).code(), refused);
  ASSERT_TRUE((*model)->FinishStep(&r).ok());
  EXPECT_EQ(r.examples, 8);
  EXPECT_EQ((*model)->FinishStep(&r).code(), refused);
  // Bad parameters for a prefetch are refused like a step's.
  testing::OwnedParams bad = *s.params;
  bad.values[0].pop_back();
  EXPECT_EQ((*model)->PrefetchParams(bad.view()).code(), absl::StatusCode::kInvalidArgument);
}

// The CPU backend shares host memory: the split step and the prefetch change nothing.
TEST(StepOverlapCpuTest, SplitStepsOnTheCpuGiveTrainStepsResults) {
  std::mt19937_64 rng(8);
  for (const ModelCase& c : Cases()) {
    SCOPED_TRACE(c.spec.ShortDebugString());
    std::unique_ptr<Backend> cpu = Cpu();
    auto a = CreateModel(c.spec, cpu.get());
    auto b = CreateModel(c.spec, cpu.get());
    ASSERT_TRUE(a.ok() && b.ok());
    std::deque<StepInputs> steps = MakeSteps(**a, c, rng, {16, 16, 7});
    for (size_t i = 0; i < steps.size(); ++i) {
      testing::OwnedParams want = *steps[i].params;
      StepResult ra, rb;
      ASSERT_TRUE((*a)->TrainStep(steps[i].batch.view(), want.view(), want.grad_view(), &ra).ok());
      ASSERT_TRUE((*b)->StartTrainStep(steps[i].batch.view(), steps[i].params->view(),
                                       steps[i].params->grad_view())
                      .ok());
      if (i + 1 < steps.size()) {
        ASSERT_TRUE((*b)->PrefetchParams(steps[i + 1].params->view()).ok());
      }
      ASSERT_TRUE((*b)->FinishStep(&rb).ok());
      EXPECT_EQ(rb.loss, ra.loss);
      EXPECT_EQ(steps[i].params->grads, want.grads);
    }
  }
}

}  // namespace
}  // namespace pscluster::kernels
