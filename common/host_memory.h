// How much memory this process may use: the machine's physical memory, or less where a cgroup
// (a container's limit) says so.
#ifndef PSCLUSTER_COMMON_HOST_MEMORY_H_
#define PSCLUSTER_COMMON_HOST_MEMORY_H_

#include <cstdint>
#include <string>

namespace pscluster {

// min(physical memory, the cgroup v2 `memory.max` or v1 `memory.limit_in_bytes` of this
// process); 0 if none of them can be read.
uint64_t HostMemoryBytes();

// The limit in a cgroup memory file's text ("max" or a byte count); 0 for "max" or unreadable
// text. Exposed for tests.
uint64_t ParseCgroupMemoryLimit(const std::string& text);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_HOST_MEMORY_H_
