#include "tests/integration/test_certs.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace pscluster::testing {

std::string MakeTestCerts() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const char* src = std::getenv("TEST_SRCDIR");
  if (tmp == nullptr || src == nullptr) {
    ADD_FAILURE() << "MakeTestCerts: TEST_TMPDIR and TEST_SRCDIR must be set (run under bazel test)";
    return "";
  }
  const std::string dir = std::string(tmp) + "/certs";
  const std::string command =
      std::string(src) + "/pscluster/tests/integration/make_certs.sh " + dir;
  if (std::system(command.c_str()) != 0) {
    ADD_FAILURE() << "openssl failed: " << command;
    return "";
  }
  return dir;
}

}  // namespace pscluster::testing
