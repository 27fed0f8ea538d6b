#include "server/client/round.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/dtype.h"

namespace pscluster {

bool Round::Enter(const v1::PullChunk& chunk) {
  absl::MutexLock l(&mu_);
  if (done_) return false;
  ++copying_;
  if (chunk.last()) last_seen_ = true;
  if (min_clock_ < 0 || chunk.min_clock() < min_clock_) min_clock_ = chunk.min_clock();
  return true;
}

absl::Status Round::Check(const v1::PullChunk& chunk, size_t bytes) const {
  if (chunk.index() >= dests_.size()) {
    return absl::InternalError(absl::StrCat("reply to request ", request_id_, " names chunk ",
                                            chunk.index(), " of ", dests_.size()));
  }
  const ReplyDest& d = dests_[chunk.index()];
  const size_t es = DTypeSize(chunk.dtype());
  if (!chunk.indices().empty()) {
    // Only what changed, at the offsets it names: a block pulled against this client's view.
    const size_t count = chunk.indices().size() / 4;
    bool fits = d.mirror != nullptr && chunk.dtype() == d.dtype && es != 0 &&
                chunk.indices().size() % 4 == 0 && bytes == count * es && chunk.offset() == 0 &&
                count <= d.elems;
    for (size_t i = 0; fits && i < count; ++i) {
      uint32_t at;
      std::memcpy(&at, chunk.indices().data() + 4 * i, 4);
      fits = at < d.elems;
    }
    if (!fits) {
      return absl::InternalError(absl::StrCat("reply to request ", request_id_, " chunk ",
                                              chunk.index(), ": its indices do not fit its block"));
    }
    return absl::OkStatus();
  }
  if (bytes == 0) return absl::OkStatus();
  const uint64_t n = es ? bytes / es : 0;
  if (chunk.dtype() != d.dtype || es == 0 || bytes % es != 0 || d.elems == 0 ||
      chunk.offset() > d.elems || n > d.elems - chunk.offset() ||
      (d.pos != nullptr && (chunk.offset() % d.width != 0 || n % d.width != 0))) {
    return absl::InternalError(absl::StrCat("reply to request ", request_id_, " chunk ",
                                            chunk.index(), " does not fit its slice"));
  }
  return absl::OkStatus();
}

void Round::Copy(const v1::PullChunk& chunk, const Payload& values) {
  absl::Status bad = Check(chunk, values.size());
  if (bad.ok() && chunk.index() < dests_.size() && dests_[chunk.index()].mirror != nullptr &&
      (!values.empty() || !chunk.indices().empty())) {
    const absl::Time t0 = absl::Now();
    CopyViaMirror(chunk, values, dests_[chunk.index()]);
    if (copy_ns_) copy_ns_->fetch_add(absl::ToInt64Nanoseconds(absl::Now() - t0));
  } else if (bad.ok() && !values.empty()) {
    const absl::Time t0 = absl::Now();
    CopyIn(chunk, values, dests_[chunk.index()]);
    if (copy_ns_) copy_ns_->fetch_add(absl::ToInt64Nanoseconds(absl::Now() - t0));
  }
  Leave(bad);
}

float* Round::DirectTarget(const v1::PullChunk& chunk, size_t bytes) const {
  if (bytes == 0 || chunk.dtype() != v1::DT_FLOAT32 || !Check(chunk, bytes).ok()) return nullptr;
  const ReplyDest& d = dests_[chunk.index()];
  if (d.pos != nullptr || d.base == nullptr || d.mirror != nullptr) return nullptr;
  return d.base + chunk.offset();
}

void Round::Received(const absl::Status& st) { Leave(st); }

void Round::Leave(const absl::Status& bad) {
  absl::MutexLock l(&mu_);
  --copying_;
  if (!bad.ok() && !done_) {
    done_ = true;
    status_ = bad;
  } else if (last_seen_ && copying_ == 0) {
    done_ = true;
  }
}

void Round::CopyIn(const v1::PullChunk& chunk, const Payload& values, const ReplyDest& d) {
  const size_t es = DTypeSize(chunk.dtype());
  const uint64_t n = values.size() / es;
  if (d.pos == nullptr) {
    values.DecodeFloats(chunk.dtype(), 0, n, d.base + chunk.offset());
    return;
  }
  const uint64_t first_row = chunk.offset() / d.width;
  const uint64_t rows = n / d.width;
  for (uint64_t r = 0; r < rows; ++r) {
    values.DecodeFloats(chunk.dtype(), r * d.width, d.width,
                        d.rows + static_cast<size_t>(d.pos[first_row + r]) * d.width);
  }
}

void Round::CopyViaMirror(const v1::PullChunk& chunk, const Payload& values,
                          const ReplyDest& d) {
  const size_t es = DTypeSize(chunk.dtype());
  if (!chunk.indices().empty()) {
    const size_t count = chunk.indices().size() / 4;
    thread_local std::vector<float> decoded;
    decoded.resize(count);
    values.DecodeFloats(chunk.dtype(), 0, count, decoded.data());
    for (size_t i = 0; i < count; ++i) {
      uint32_t at;
      std::memcpy(&at, chunk.indices().data() + 4 * i, 4);
      d.mirror[at] = decoded[i];
    }
    std::memcpy(d.base, d.mirror, d.elems * sizeof(float));
  } else {
    const uint64_t n = values.size() / es;
    values.DecodeFloats(chunk.dtype(), 0, n, d.mirror + chunk.offset());
    std::memcpy(d.base + chunk.offset(), d.mirror + chunk.offset(), n * sizeof(float));
  }
  // The view this copy now matches (0 from a server that keeps none: start one next time). A
  // whole block in several chunks (a server without the view asked for) keeps none either.
  *d.view = (chunk.indices().empty() && (chunk.offset() != 0 || values.size() / es != d.elems))
                ? 0
                : chunk.view();
}

void Round::Fail(const absl::Status& st) {
  absl::MutexLock l(&mu_);
  if (done_) return;
  done_ = true;
  status_ = st;
}

void Round::AddSlice() {
  absl::MutexLock l(&mu_);
  ++slices_;
}

void Round::ReleaseSlice() {
  absl::MutexLock l(&mu_);
  --slices_;
}

bool Round::Finished(absl::Status* st) const {
  absl::MutexLock l(&mu_);
  if (!done_ || copying_ != 0) return false;
  if (st) *st = status_;
  return true;
}

absl::Status Round::Wait(absl::Time deadline) {
  absl::MutexLock l(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ && copying_ == 0; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    done_ = true;
    status_ = absl::DeadlineExceededError(
        absl::StrCat("request ", request_id_, " got no complete reply before its deadline"));
    // A copy may still be running on the reading thread; wait for it before returning.
    mu_.Await(absl::Condition(+[](int* c) { return *c == 0; }, &copying_));
  }
  return status_;
}

bool Round::AwaitFinished(absl::Time until) const {
  absl::MutexLock l(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ && copying_ == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&ready), until);
}

void Round::WaitSlicesReleased() {
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(+[](int* s) { return *s == 0; }, &slices_));
}

int64_t Round::min_clock() const {
  absl::MutexLock l(&mu_);
  return min_clock_;
}

}  // namespace pscluster
