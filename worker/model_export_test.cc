// ExportDirReady with and without an export root (common/path_root.h); exports written through
// an injected file system, from a FakeParamClient, crashed at every step.
#include "worker/model_export.h"

#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
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
  ASSERT_THAT(Export(0), IsOk());
  auto old_bytes = fs_.ReadFile(kPath);
  ASSERT_THAT(old_bytes, IsOk());
  ASSERT_THAT(Train(), IsOk());
  const int before = fs_.ops();
  ASSERT_THAT(Export(1), IsOk());
  const int ops = fs_.ops() - before;
  auto new_bytes = fs_.ReadFile(kPath);
  ASSERT_THAT(new_bytes, IsOk());
  ASSERT_NE(*new_bytes, *old_bytes);
  for (int k = 0; k < ops; ++k) {
    ASSERT_THAT(WriteFileAtomically(&fs_, kPath, *old_bytes), IsOk());
    fs_.CrashAfter(k);
    EXPECT_FALSE(Export(1).ok()) << "crash after " << k;
    fs_.Crash();
    auto after = fs_.ReadFile(kPath);
    ASSERT_THAT(after, IsOk()) << "crash after " << k;
    EXPECT_TRUE(*after == *old_bytes || *after == *new_bytes) << "crash after " << k;
    EXPECT_THAT(SafetensorsFile::Parse(*after, kPath), IsOk());
    EXPECT_THAT(fs_.Files(), ::testing::ElementsAre(kPath)) << "crash after " << k;
  }
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

}  // namespace
}  // namespace pscluster::worker
