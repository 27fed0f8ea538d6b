// ExportDirReady with and without an export root (common/path_root.h); exports written through
// an injected file system, from a FakeParamClient, crashed at every step.
#include "worker/model_export.h"

#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "common/atomic_file.h"
#include "common/path_root.h"
#include "common/safetensors.h"
#include "common/testing/fault_injection_fs.h"
#include "common/testing/status_matchers.h"
#include "server/client/testing/fake_param_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster::worker {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(ExportDirReadyTest, CreatesTheDirectoryInsideTheRootAndRefusesPathsOutsideIt) {
  const std::string base = std::string(std::getenv("TEST_TMPDIR")) + "/export";
  ASSERT_THAT(MakeDirs(base + "/root"), IsOk());
  auto root = ResolveRoot(base + "/root", "--export_root");
  ASSERT_THAT(root.status(), IsOk());

  EXPECT_THAT(ExportDirReady(*root + "/job-1/model.safetensors", *root), IsOk());
  struct stat st;
  EXPECT_EQ(stat((*root + "/job-1").c_str(), &st), 0);  // Created.

  EXPECT_THAT(ExportDirReady(base + "/elsewhere/model.safetensors", *root),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("export_path: " + base + "/elsewhere/model.safetensors is "
                                 "outside " + *root)));
  EXPECT_NE(stat((base + "/elsewhere").c_str(), &st), 0);  // Nothing created outside.
  EXPECT_THAT(ExportDirReady(*root + "/../escape/m.safetensors", *root, "path"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("path: ")));
  // Without a root, any writable place.
  EXPECT_THAT(ExportDirReady(base + "/elsewhere/model.safetensors"), IsOk());
}

// Two parameters (a dense 2 x 3 tensor and a sparse table of rows of 2) in a fake store.
class ExportParamsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kernels::ParamInfo w;
    w.name = "w";
    w.shape = {2, 3};
    w.init.set_kind(v1::InitializerSpec::UNIFORM);
    w.init.set_low(-1);
    w.init.set_high(1);
    kernels::ParamInfo emb = w;
    emb.name = "emb";
    emb.sparse = true;
    emb.shape.clear();
    emb.row_width = 2;
    params_ = {w, emb};
    std::vector<v1::TableSpec> tables;
    for (const auto& p : params_) {
      v1::TableSpec t;
      t.set_name(p.name);
      t.set_kind(p.sparse ? v1::SPARSE : v1::DENSE);
      for (int64_t d : p.shape) t.mutable_shape()->add_dims(static_cast<uint64_t>(d));
      t.set_row_width(static_cast<uint32_t>(p.row_width));
      *t.mutable_init() = p.init;
      t.mutable_optimizer()->set_learning_rate(0.5f);
      tables.push_back(t);
    }
    client_ = std::make_unique<FakeParamClient>(store_, 0, v1::ShardMap(), tables);
    ASSERT_THAT(client_->CreateTables({}, 1), IsOk());
    ASSERT_THAT(fs_.MakeDirs("/models"), IsOk());
  }

  absl::Status Export(int64_t clock) {
    return ExportParams(params_, client_.get(), clock, keys_, kPath, {{"step", "x"}}, &fs_)
        .status();
  }

  absl::Status Train() {
    std::vector<float> g(6, 1.f), rg(4, 1.f);
    return client_->Push(0, {{{"w", g.data()}}, {{"emb", keys_, rg.data()}}});
  }
  // The keys the servers hold listed, two rows a pull.
  absl::Status ExportAtListed(int64_t clock) {
    return ExportListed(params_, client_.get(), clock, kPath, {{"step", "x"}}, &fs_, "export_path",
                        /*rows_per_pull=*/2)
        .status();
  }
  std::vector<float> Floats(const SafetensorsFile& file, const std::string& name) {
    const SafetensorsFile::Entry* e = file.Find(name);
    if (e == nullptr) {
      ADD_FAILURE() << "no tensor " << name;
      return {};
    }
    EXPECT_EQ(e->dtype, v1::DT_FLOAT32) << name;
    std::vector<float> out(file.Data(*e).size() / sizeof(float));
    std::memcpy(out.data(), file.Data(*e).data(), out.size() * sizeof(float));
    return out;
  }

  // Writes an export over an older one with `export_at` (at clock 1), crashed after each of its
  // file-system steps in turn: the older export or the new one is left, whole, never a file cut
  // short, and no temporary file.
  void CrashAtEveryStep(const std::function<absl::Status(int64_t clock)>& export_at) {
    ASSERT_THAT(Train(), IsOk());
    ASSERT_THAT(export_at(0), IsOk());
    auto old_bytes = fs_.ReadFile(kPath);
    ASSERT_THAT(old_bytes, IsOk());
    ASSERT_THAT(Train(), IsOk());
    const int before = fs_.ops();
    ASSERT_THAT(export_at(1), IsOk());
    const int ops = fs_.ops() - before;
    auto new_bytes = fs_.ReadFile(kPath);
    ASSERT_THAT(new_bytes, IsOk());
    ASSERT_NE(*new_bytes, *old_bytes);
    for (int k = 0; k < ops; ++k) {
      ASSERT_THAT(WriteFileAtomically(&fs_, kPath, *old_bytes), IsOk());
      fs_.CrashAfter(k);
      EXPECT_FALSE(export_at(1).ok()) << "crash after " << k;
      fs_.Crash();
      auto after = fs_.ReadFile(kPath);
      ASSERT_THAT(after, IsOk()) << "crash after " << k;
      EXPECT_TRUE(*after == *old_bytes || *after == *new_bytes) << "crash after " << k;
      EXPECT_THAT(SafetensorsFile::Parse(*after, kPath), IsOk());
      EXPECT_THAT(fs_.Files(), ::testing::ElementsAre(kPath)) << "crash after " << k;
    }
    ASSERT_THAT(WriteFileAtomically(&fs_, kPath, *old_bytes), IsOk());
  }

  static constexpr char kPath[] = "/models/job-1.safetensors";
  std::vector<kernels::ParamInfo> params_;
  std::vector<uint64_t> keys_ = {3, 8};
  std::shared_ptr<FakeParameterStore> store_ = std::make_shared<FakeParameterStore>();
  std::unique_ptr<FakeParamClient> client_;
  ::pscluster::testing::FaultInjectionFileSystem fs_;
};

TEST_F(ExportParamsTest, TheFileHoldsWhatTheServersHoldAtThatClock) {
  ASSERT_THAT(Train(), IsOk());
  ASSERT_THAT(Export(1), IsOk());
  auto bytes = fs_.ReadFile(kPath);
  ASSERT_THAT(bytes, IsOk());
  auto file = SafetensorsFile::Parse(*bytes, kPath);
  ASSERT_THAT(file, IsOk());
  const SafetensorsFile::Entry* w = file->Find("w");
  ASSERT_NE(w, nullptr);
  std::vector<float> got(6);
  ASSERT_EQ(file->Data(*w).size(), sizeof(float) * 6);
  std::memcpy(got.data(), file->Data(*w).data(), sizeof(float) * 6);
  EXPECT_EQ(got, store_->Dense("w"));
  ASSERT_NE(file->Find("emb.keys"), nullptr);
  EXPECT_EQ(file->Find("emb")->shape, (std::vector<uint64_t>{2, 2}));
  EXPECT_THAT(store_->pull_clocks(0), ::testing::ElementsAre(1));
}

// A crash anywhere in writing an export over an older one (the temporary file's creation,
// write, fsync, close, the rename, the directory's sync) leaves the older export or the new one,
// whole, never a file cut short.
TEST_F(ExportParamsTest, ACrashAnywhereInAnExportLeavesTheOldFileOrTheNewOneWhole) {
  CrashAtEveryStep([&](int64_t clock) { return Export(clock); });
}

TEST_F(ExportParamsTest, AFailedWriteIsReportedWithThePathAndLeavesTheOldFile) {
  ASSERT_THAT(Export(0), IsOk());
  auto old_bytes = fs_.ReadFile(kPath);
  fs_.FailNext(::pscluster::testing::FaultInjectionFileSystem::Op::kSync,
               absl::ResourceExhaustedError("fsync /models: No space left on device"));
  // (psctl export --to PATH: the error is the path's.)
  EXPECT_THAT(Export(1), StatusIs(absl::StatusCode::kResourceExhausted,
                                  AllOf(StartsWith("path: /models/job-1.safetensors"),
                                        HasSubstr("No space left"))));
  EXPECT_EQ(fs_.ReadFile(kPath).value(), old_bytes.value());
  // The directory check goes through the same file system.
  fs_.FailNext(::pscluster::testing::FaultInjectionFileSystem::Op::kMakeDirs,
               absl::PermissionDeniedError("mkdir /models/new: Permission denied"));
  EXPECT_THAT(ExportDirReady("/models/new/m.safetensors", "", "export_path", &fs_),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("export_path: /models/new: mkdir")));
}

// A model over the user's keys: each sparse table at the keys its servers hold a row for (three
// pushed, one only read, which has none), in increasing order, each row as the store holds it;
// the rows pulled and written two at a time.
TEST_F(ExportParamsTest, AListedExportWritesEverySparseTableAtTheKeysWithARow) {
  std::vector<float> g(6, 1.f), rg(6, 1.f), read(2);
  const std::vector<uint64_t> pushed = {21, 3, 8};
  ASSERT_THAT(client_->Push(0, {{{"w", g.data()}}, {{"emb", pushed, rg.data()}}}), IsOk());
  const std::vector<uint64_t> only_read = {40};
  ASSERT_THAT(client_->Pull(1, {{}, {{"emb", only_read, read.data()}}}), IsOk());
  ASSERT_THAT(ExportAtListed(1), IsOk());
  auto bytes = fs_.ReadFile(kPath);
  ASSERT_THAT(bytes, IsOk());
  auto file = SafetensorsFile::Parse(*bytes, kPath);
  ASSERT_THAT(file, IsOk());
  EXPECT_EQ(Floats(*file, "w"), store_->Dense("w"));
  const SafetensorsFile::Entry* k = file->Find("emb.keys");
  ASSERT_NE(k, nullptr);
  ASSERT_EQ(k->dtype, v1::DT_UINT64);
  std::vector<uint64_t> keys(file->Data(*k).size() / sizeof(uint64_t));
  std::memcpy(keys.data(), file->Data(*k).data(), keys.size() * sizeof(uint64_t));
  EXPECT_EQ(keys, (std::vector<uint64_t>{3, 8, 21}));
  EXPECT_EQ(file->Find("emb")->shape, (std::vector<uint64_t>{3, 2}));
  const std::vector<float> rows = Floats(*file, "emb");
  ASSERT_EQ(rows.size(), 6u);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto held = store_->Row("emb", keys[i]);
    ASSERT_TRUE(held.has_value()) << keys[i];
    EXPECT_EQ(std::vector<float>(rows.begin() + 2 * i, rows.begin() + 2 * i + 2), *held) << keys[i];
  }
  EXPECT_EQ(file->metadata().at("step"), "x");
}

// Written as it streams, the listed export is still all or nothing: a crash anywhere leaves the
// older export or the new one, whole.
TEST_F(ExportParamsTest, ACrashAnywhereInAListedExportLeavesTheOldFileOrTheNewOneWhole) {
  CrashAtEveryStep([&](int64_t clock) { return ExportAtListed(clock); });
  auto old_bytes = fs_.ReadFile(kPath);
  ASSERT_THAT(old_bytes, IsOk());
  // A failed write names the field and leaves the old file.
  fs_.FailNext(::pscluster::testing::FaultInjectionFileSystem::Op::kSync,
               absl::ResourceExhaustedError("fsync /models: No space left on device"));
  EXPECT_THAT(ExportAtListed(1), StatusIs(absl::StatusCode::kResourceExhausted,
                                          AllOf(StartsWith("export_path: /models/job-1"),
                                                HasSubstr("No space left"))));
  EXPECT_EQ(fs_.ReadFile(kPath).value(), old_bytes.value());
}

}  // namespace
}  // namespace pscluster::worker
