#include "common/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"

namespace pscluster {
namespace {

std::string ReadSmallFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

uint64_t ParseCgroupMemoryLimit(const std::string& text) {
  uint64_t v = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &v)) return 0;  // "max", garbage.
  // cgroup v1 writes "no limit" as a number near 2^63.
  return v >= (uint64_t{1} << 62) ? 0 : v;
}

uint64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  uint64_t mem =
      pages > 0 && size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(size) : 0;
  for (const char* path : {"/sys/fs/cgroup/memory.max",
                           "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const uint64_t limit = ParseCgroupMemoryLimit(ReadSmallFile(path));
    if (limit > 0) mem = mem == 0 ? limit : std::min(mem, limit);
  }
  return mem;
}

}  // namespace pscluster
