#include "server/client/ps_stream.h"

#include "absl/strings/str_cat.h"
#include "common/status_convert.h"
#include "server/wire.h"

namespace pscluster {

std::shared_ptr<PsStream> PsStream::Open(grpc::GenericStub* stub, const std::string& peer,
                                         absl::Duration lifetime, const ChannelOptions& channel,
                                         const DataAuth& auth) {
  std::shared_ptr<PsStream> s(new PsStream(peer));
  s->self_ = s;
  s->opened_ = absl::Now();
  s->ctx_.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(lifetime));
  // The bearer token, if any, is added by the channel (common/channel.cc) to every call.
  const std::string proof = GrpcDataAuthValue(auth);
  if (!proof.empty()) s->ctx_.AddMetadata(kGrpcDataAuthKey, proof);
  stub->PrepareBidiStreamingCall(&s->ctx_, "/pscluster.v1.ParameterServer/PushPull",
                                 grpc::StubOptions(), s.get());
  s->AddHold();
  s->StartRead(&s->read_buf_);
  s->StartCall();
  return s;
}

bool PsStream::usable() const {
  absl::MutexLock l(&mu_);
  return !closing_;
}

absl::Status PsStream::Send(const std::shared_ptr<Round>& round,
                            std::vector<grpc::ByteBuffer> messages) {
  {
    absl::MutexLock l(&mu_);
    if (closing_) {
      return absl::UnavailableError(absl::StrCat("stream to ", peer_, " is closed"));
    }
    rounds_[round->request_id()] = round;
    for (auto& m : messages) writes_.push_back(std::move(m));
  }
  StartNextWrite();
  return absl::OkStatus();
}

void PsStream::StartNextWrite() {
  {
    absl::MutexLock l(&mu_);
    if (writing_ || writes_.empty() || hold_released_) return;
    writing_ = true;
    current_write_ = std::move(writes_.front());
    writes_.pop_front();
    ++starting_;
  }
  StartWrite(&current_write_);
  EndOp();
}

void PsStream::OnWriteDone(bool ok) {
  {
    absl::MutexLock l(&mu_);
    writing_ = false;
    current_write_.Clear();
    if (!ok) {
      writes_.clear();
      closing_ = true;
    }
    ++starting_;
  }
  // The stream may have begun closing (the server finished the call) while this write was in
  // flight: EndOp then releases the hold that waited for it, or the call would never end.
  if (ok) StartNextWrite();
  EndOp();
}

void PsStream::OnReadDone(bool ok) {
  if (!ok) {
    BeginClose(false);
    return;
  }
  v1::PullChunk chunk;
  Payload values;
  absl::Status st =
      DecodeWithPayload(read_buf_, kPullChunkValuesField, &chunk, &values, "PullChunk");
  read_buf_.Clear();  // `values` keeps the slices it needs.
  if (!st.ok()) {
    StartRead(&read_buf_);
    FailAll(absl::InternalError(absl::StrCat("reply from ", peer_, ": ", st.message())));
    Cancel();
    return;
  }
  std::shared_ptr<Round> round;
  bool idle = false;
  {
    absl::MutexLock l(&mu_);
    auto it = rounds_.find(chunk.request_id());
    if (it != rounds_.end()) {
      round = it->second;
      if (chunk.last()) {
        rounds_.erase(it);
        idle = rounds_.empty() && retiring_;
      }
    }
  }
  // Enter before the next read starts, so the round cannot complete while this chunk is still
  // being copied; the copy then overlaps the receipt of the next reply.
  const bool copy = round != nullptr && round->Enter(chunk);
  StartRead(&read_buf_);
  if (copy) round->Copy(chunk, values);
  if (idle) BeginClose(true);
}

void PsStream::Forget(uint64_t request_id) {
  bool idle;
  {
    absl::MutexLock l(&mu_);
    rounds_.erase(request_id);
    idle = rounds_.empty() && retiring_;
  }
  if (idle) BeginClose(true);
}

void PsStream::Cancel() { ctx_.TryCancel(); }

void PsStream::Shutdown(absl::Duration timeout) {
  auto done = done_;
  Cancel();
  done->WaitForNotificationWithTimeout(timeout);
}

void PsStream::Retire() {
  bool idle;
  {
    absl::MutexLock l(&mu_);
    retiring_ = true;
    closing_ = true;
    idle = rounds_.empty();
  }
  if (idle) BeginClose(true);
}

void PsStream::BeginClose(bool half_close) {
  {
    absl::MutexLock l(&mu_);
    closing_ = true;
    if (half_close) half_close_ = true;
    ++starting_;
  }
  EndOp();
}

void PsStream::EndOp() {
  bool writes_done = false, release = false;
  {
    absl::MutexLock l(&mu_);
    --starting_;
    if (closing_ && !hold_released_ && starting_ == 0 && !writing_ && writes_.empty()) {
      hold_released_ = true;
      writes_done = half_close_;
      release = true;
    }
  }
  // After RemoveHold no operation is started from outside a reaction any more.
  if (writes_done) StartWritesDone();
  if (release) RemoveHold();
}

void PsStream::OnWritesDoneDone(bool) {}

void PsStream::FailAll(const absl::Status& st) {
  absl::flat_hash_map<uint64_t, std::shared_ptr<Round>> rounds;
  {
    absl::MutexLock l(&mu_);
    closing_ = true;
    rounds.swap(rounds_);
  }
  for (auto& [id, r] : rounds) r->Fail(st);
}

void PsStream::OnDone(const grpc::Status& status) {
  absl::Status st = FromGrpcStatus(status, absl::StrCat("PushPull to ", peer_));
  if (st.ok()) st = absl::UnavailableError(absl::StrCat("stream to ", peer_, " ended"));
  FailAll(st);
  auto done = done_;
  self_.reset();  // May delete this.
  done->Notify();
}

}  // namespace pscluster
