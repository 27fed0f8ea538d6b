// How dense blocks and sparse rows map to virtual shards. Servers, workers and the scheduler
// must agree bit for bit, so the hash is fixed here (FNV-1a over the table name, mixed with
// splitmix64 of the block index or key) and never depends on the build or the process.
#ifndef PSCLUSTER_COMMON_SHARDING_H_
#define PSCLUSTER_COMMON_SHARDING_H_

#include <cstdint>
#include <string_view>

namespace pscluster {

inline constexpr uint64_t kDefaultBlockElems = 65536;  // 256 KiB of float32 per block.
inline constexpr uint32_t kDefaultVirtualShards = 64;

// Stable 64-bit hash of a table name.
uint64_t TableHash(std::string_view table);

// Finaliser of splitmix64: a bijection on uint64 with good avalanche.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// REQUIRES: num_shards > 0.
inline uint32_t ShardOfBlock(uint64_t table_hash, uint64_t block, uint32_t num_shards) {
  return static_cast<uint32_t>(Mix64(table_hash ^ Mix64(block)) % num_shards);
}

// REQUIRES: num_shards > 0.
inline uint32_t ShardOfKey(uint64_t table_hash, uint64_t key, uint32_t num_shards) {
  return static_cast<uint32_t>(Mix64(table_hash + 0x5bd1e995ULL * Mix64(key)) % num_shards);
}

// Number of blocks of a dense tensor of `elems` elements. REQUIRES: block_elems > 0.
inline uint64_t NumBlocks(uint64_t elems, uint64_t block_elems) {
  return (elems + block_elems - 1) / block_elems;
}

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_SHARDING_H_
