// ExportDirReady with and without an export root (common/path_root.h).
#include "worker/model_export.h"

#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "common/atomic_file.h"
#include "common/path_root.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster::worker {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::HasSubstr;

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

}  // namespace
}  // namespace pscluster::worker
