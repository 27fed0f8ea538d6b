#include "common/sharding.h"

namespace pscluster {

uint64_t TableHash(std::string_view table) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a offset basis.
  for (unsigned char c : table) {
    h ^= c;
    h *= 0x100000001b3ULL;  // FNV prime.
  }
  return Mix64(h);
}

}  // namespace pscluster
