#include "common/path_root.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::HasSubstr;

class PathRootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = std::string(std::getenv("TEST_TMPDIR")) + "/roots";
    ::mkdir(base_.c_str(), 0755);
    ::mkdir((base_ + "/root").c_str(), 0755);
    ::mkdir((base_ + "/root/jobs").c_str(), 0755);
    ::mkdir((base_ + "/outside").c_str(), 0755);
    if (::symlink((base_ + "/outside").c_str(), (base_ + "/root/escape").c_str()) != 0) {
      ASSERT_EQ(errno, EEXIST) << "symlink: " << std::strerror(errno);  // Made by an earlier test.
    }
    auto r = ResolveRoot(base_ + "/root/", "--checkpoint_root");
    ASSERT_THAT(r.status(), IsOk());
    root_ = *r;
  }
  std::string base_, root_;
};

TEST_F(PathRootTest, PathsInsideTheRootPassExistingOrNot) {
  EXPECT_THAT(CheckUnderRoot(root_, root_, "dir"), IsOk());
  EXPECT_THAT(CheckUnderRoot(root_ + "/jobs", root_, "dir"), IsOk());
  EXPECT_THAT(CheckUnderRoot(root_ + "/jobs/new/deeper/file.ckpt", root_, "dir"), IsOk());
  EXPECT_THAT(CheckUnderRoot(root_ + "/jobs/../jobs/./x", root_, "dir"), IsOk());
  EXPECT_THAT(CheckUnderRoot("/anything/at/all", "", "dir"), IsOk());  // No root: unconfined.
}

TEST_F(PathRootTest, EscapesAreRefusedNamingTheFieldPathAndRoot) {
  EXPECT_THAT(CheckUnderRoot("/etc/passwd", root_, "path"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("path: /etc/passwd is outside " + root_)));
  EXPECT_THAT(CheckUnderRoot(root_ + "/../outside/x", root_, "dir"),
              StatusIs(absl::StatusCode::kPermissionDenied));
  // A symlink inside the root that points out of it.
  EXPECT_THAT(CheckUnderRoot(root_ + "/escape/x.ckpt", root_, "dir"),
              StatusIs(absl::StatusCode::kPermissionDenied));
  // A sibling whose name starts like the root.
  EXPECT_THAT(CheckUnderRoot(root_ + "-other/x", root_, "dir"),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(CheckUnderRoot("relative/dir", root_, "checkpoint_dir"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("checkpoint_dir: 'relative/dir' must be an absolute path")));
}

TEST_F(PathRootTest, RootsMustBeExistingAbsoluteDirectories) {
  EXPECT_THAT(ResolveRoot("relative", "--export_root"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--export_root")));
  EXPECT_THAT(ResolveRoot(base_ + "/missing", "--export_root"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not exist")));
  EXPECT_THAT(ResolveRoot("/etc/hostname", "--export_root"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a directory")));
}

}  // namespace
}  // namespace pscluster
