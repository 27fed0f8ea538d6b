// Scanning numbers out of text lines, and hashing strings, fast enough for the readers' targets
// (100 MB/s of text per core). Every scanner reads at [*p, end), never skips leading spaces, and
// on success advances *p past what it read; on failure *p is unchanged.
#ifndef PSCLUSTER_WORKER_DATA_TEXT_SCAN_H_
#define PSCLUSTER_WORKER_DATA_TEXT_SCAN_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace pscluster::data {

// A finite decimal number ([+-]digits[.digits][(e|E)[+-]digits], or starting with '.'), rounded
// as strtof rounds. False for no number, "inf"/"nan", hex, or a value beyond float's range.
bool ScanFloat(const char** p, const char* end, float* out);

// [+-]digits within int64.
bool ScanInt64(const char** p, const char* end, int64_t* out);

// digits within uint64.
bool ScanUint64(const char** p, const char* end, uint64_t* out);

// A stable 64-bit hash of the bytes (the same in every build and process).
uint64_t HashBytes(absl::string_view s, uint64_t seed);

// Up to `max` bytes of text starting at `p`, stopping before a tab, a space or `stop`, for
// "found '...'" in messages ("" at the end of the line).
absl::string_view TokenAt(const char* p, const char* end, char stop = '\0', size_t max = 24);

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_TEXT_SCAN_H_
