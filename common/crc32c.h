// CRC-32C (Castagnoli, the polynomial of iSCSI, ext4 and LevelDB): the checksum of checkpoint
// files. Uses the SSE4.2 crc32 instruction where the CPU has it, a slicing-by-8 table otherwise;
// both give identical results.
#ifndef PSCLUSTER_COMMON_CRC32C_H_
#define PSCLUSTER_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace pscluster {

// Extends `crc` (the CRC-32C of some earlier bytes; 0 for none) with `n` bytes at `data`.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

// CRC-32C of `data`.
inline uint32_t Crc32c(absl::string_view data) { return Crc32cExtend(0, data.data(), data.size()); }

// The portable table implementation (exposed so tests can compare it with the hardware path).
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_CRC32C_H_
