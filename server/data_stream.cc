#include "server/data_stream.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "common/status_convert.h"
#include "server/wire.h"

namespace pscluster {

struct DataStream::PushItem {
  v1::PushChunk chunk;
  Payload values;
  uint32_t index = 0;  // Position of the chunk in its round.
  absl::Time received;
};

struct DataStream::ReadItem {
  uint64_t request_id = 0;
  uint32_t index = 0;
  bool terminator = false;   // Only closes the round (an empty chunk with last = true).
  PsHandler::PullPlan plan;  // One slice (PushPull) or the whole request (Pull).
  size_t slice = 0;          // Slice being produced.
  uint64_t epoch = 0;
  int64_t clock = 0;
  uint64_t first = 0;        // Element range of the current slice.
  uint64_t end = 0;
  uint64_t next = 0;
  bool round_last = false;   // The round ends with this item's last chunk.
  int64_t min_clock = 0;
  // Set when the read follows the reader's own push of the slice in the round that ends its
  // step (PushChunk.step_final): it may be served before the reader's clock advances.
  int64_t own_worker = -1;
  int64_t own_step = 0;
  int64_t early_min = -1;   // The clock such a read reflected when it was served early.
  // Pull compression: the reader's rank and the view it holds of the block (PushChunk.pull_view;
  // 0 = none asked for).
  uint32_t worker = 0;
  uint64_t pull_view = 0;
};

std::shared_ptr<DataStream> DataStream::Create(Mode mode, PsHandler* handler, Executor* executor,
                                               std::shared_ptr<BufferPool> pool,
                                               const DataPlaneOptions& options, Ops ops) {
  std::shared_ptr<DataStream> s(
      new DataStream(mode, handler, executor, std::move(pool), options, std::move(ops)));
  std::weak_ptr<DataStream> weak = s;
  auto schedule = [executor, weak](std::function<void()> fn) {
    // The queue's closures keep the stream alive until they ran.
    executor->Post([self = weak.lock(), fn = std::move(fn)] {
      if (self) fn();
    });
  };
  s->apply_q_ = std::make_unique<SerialQueue>(schedule);
  s->read_q_ = std::make_unique<SerialQueue>(schedule);
  return s;
}

DataStream::DataStream(Mode mode, PsHandler* handler, Executor* executor,
                       std::shared_ptr<BufferPool> pool, const DataPlaneOptions& options, Ops ops)
    : mode_(mode),
      handler_(handler),
      executor_(executor),
      pool_(std::move(pool)),
      options_(options),
      ops_(std::move(ops)) {}

DataStream::~DataStream() = default;

void DataStream::Schedule(std::function<void()> fn) {
  executor_->Post([self = shared_from_this(), fn = std::move(fn)] { fn(); });
}

// ------------------------------------------------------------------ finishing

bool DataStream::FinishDueLocked() {
  if (!finish_wanted_ || finished_ || starting_ > 0 || writing_) return false;
  finished_ = true;
  return true;
}

void DataStream::EndOp() {
  grpc::Status st;
  bool finish;
  {
    absl::MutexLock l(&mu_);
    --starting_;
    finish = FinishDueLocked();
    st = finish_status_;
  }
  if (finish) ops_.finish(st);
}

void DataStream::RequestFinish(grpc::Status st) {
  bool finish;
  std::shared_ptr<Job> parked;
  uint64_t parked_id = 0;
  {
    absl::MutexLock l(&mu_);
    if (finish_wanted_) return;
    finish_wanted_ = true;
    finish_status_ = st;
    if (!st.ok()) writes_.clear();
    parked = std::move(parked_job_);
    parked_id = parked_id_;
    paused_producer_ = nullptr;
    finish = FinishDueLocked();
  }
  if (parked) parked->CancelWait(parked_id);
  // Queued work would only be skipped now; dropping it releases the references it holds.
  apply_q_->Clear();
  read_q_->Clear();
  if (finish) ops_.finish(st);
}

void DataStream::Fail(const absl::Status& st) {
  Logger("server")->debug("data-plane call failed: {}", st);
  RequestFinish(ToGrpcStatus(st));
}

void DataStream::Abort(const absl::Status& st) { Fail(st); }

void DataStream::OnCancel() {
  RequestFinish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
}

void DataStream::MaybeComplete() {
  bool done = false;
  {
    absl::MutexLock l(&mu_);
    if (finish_wanted_) return;
    if (mode_ == Mode::kPush) {
      done = reads_done_ && queued_ == 0;
      if (done) {
        v1::PushResponse resp;
        resp.set_request_id(last_request_id_);
        resp.set_applied(applied_);
        resp.set_duplicates(duplicates_);
        resp.set_clock(clock_);
        *push_response_ = SerializeSmall(resp);
      }
    } else {
      done = reads_done_ && queued_ == 0 && reads_pending_ == 0 && writes_.empty() && !writing_;
    }
  }
  if (done) RequestFinish(grpc::Status::OK);
}

// ------------------------------------------------------------------ receiving pushes

void DataStream::StartReading(grpc::ByteBuffer* push_response) {
  push_response_ = push_response;
  MaybeStartRead();
}

void DataStream::MaybeStartRead() {
  {
    absl::MutexLock l(&mu_);
    if (finish_wanted_ || reads_done_ || read_outstanding_ ||
        queued_ >= options_.max_queued_chunks) {
      return;
    }
    read_outstanding_ = true;
    ++starting_;
  }
  ops_.start_read(&read_buf_);
  EndOp();
}

void DataStream::OnReadDone(bool ok) {
  if (!ok) {
    {
      absl::MutexLock l(&mu_);
      read_outstanding_ = false;
      reads_done_ = true;
    }
    MaybeComplete();
    return;
  }
  auto item = std::make_shared<PushItem>();
  const absl::Time t0 = absl::Now();
  absl::Status st = DecodeWithPayload(read_buf_, kPushChunkValuesField, &item->chunk,
                                      &item->values,
                                      mode_ == Mode::kPush ? "Push: PushChunk" : "PushPull: PushChunk");
  read_buf_.Clear();
  if (st.ok()) {
    st = socket_ ? CheckSocketAuth(item->chunk)
                 : CheckCallAuth(item->chunk.tag().job_id(), item->chunk.tag().worker());
  }
  item->received = absl::Now();
  handler_->AddTime(PsHandler::Phase::kParse, item->received - t0);
  handler_->CountChunkIn();
  {
    absl::MutexLock l(&mu_);
    read_outstanding_ = false;
    if (st.ok()) {
      ++queued_;
      uint32_t& next = round_index_[item->chunk.request_id()];
      item->index = next++;
      if (item->chunk.last()) round_index_.erase(item->chunk.request_id());
    }
  }
  if (!st.ok()) {
    Fail(st);
    return;
  }
  handler_->AddQueueDepth(1);
  // A primary's copies are applied where they arrive, never on the data threads: those may be
  // waiting for this server's own copies to be applied elsewhere.
  const bool small =
      item->values.size() <= options_.inline_bytes || !item->chunk.replica_of().empty();
  apply_q_->Post(
      [self = shared_from_this(), item](SerialQueue::Done done) {
        self->ApplyOne(item);
        done();
      },
      small);
  MaybeStartRead();
}

void DataStream::SetSocketAuth(bool bound, DataAuth claim) {
  socket_ = true;
  bound_ = bound;
  claim_ = std::move(claim);
}

void DataStream::SetCallAuth(CallAuth auth) { call_auth_ = std::move(auth); }

absl::Status DataStream::CheckCallAuth(const std::string& job, uint32_t worker) {
  if (!verified_job_.empty() && job == verified_job_ && worker == call_auth_.claim.worker) {
    return absl::OkStatus();
  }
  absl::Status st = handler_->CheckGrpcDataProof(job, worker, call_auth_);
  if (st.ok() && !handler_->DataSecret(job).empty()) verified_job_ = job;
  return st;
}

absl::Status DataStream::CheckSocketAuth(const v1::PushChunk& chunk) const {
  const std::string& job = chunk.tag().job_id();
  absl::Status st;
  if (!bound_) {
    if (!handler_->DataSecret(job).empty()) {
      st = absl::UnauthenticatedError(absl::StrCat(
          "job ", job, " takes data only on connections that prove its data secret"));
    }
  } else if (job != claim_.job_id) {
    st = absl::PermissionDeniedError(absl::StrCat("this data connection is authenticated for job ",
                                                  claim_.job_id, ", not for job ", job));
  } else if (claim_.worker == kReplicaWorker) {
    if (chunk.replica_of().empty()) {
      st = absl::PermissionDeniedError(
          "this data connection is a server's: it carries copies to backups only");
    }
  } else if (!chunk.replica_of().empty()) {
    st = absl::PermissionDeniedError(
        "copies to backups come only on a server's data connection, not a worker's");
  } else if (chunk.tag().worker() != claim_.worker) {
    st = absl::PermissionDeniedError(absl::StrCat(
        "this data connection is authenticated for worker ", claim_.worker, " of job ", job,
        ", not for worker ", chunk.tag().worker()));
  }
  if (!st.ok()) Logger("server")->warn("data chunk refused: {}", st.message());
  return st;
}

void DataStream::ApplyOne(const std::shared_ptr<PushItem>& item) {
  bool skip;
  {
    absl::MutexLock l(&mu_);
    skip = finish_wanted_;
  }
  const v1::PushChunk& c = item->chunk;
  if (!skip) {
    const absl::Time t0 = absl::Now();
    handler_->AddTime(PsHandler::Phase::kQueue, t0 - item->received);
    auto r = handler_->Push(c, item->values);
    handler_->AddTime(PsHandler::Phase::kApply, absl::Now() - t0);
    if (!r.ok()) {
      Fail(absl::Status(r.status().code(),
                        absl::StrCat(r.status().message(), " [request ", c.request_id(), "]")));
    } else {
      {
        absl::MutexLock l(&mu_);
        last_request_id_ = c.request_id();
        applied_ += r->applied;
        duplicates_ += r->duplicate;
        clock_ = r->clock;
      }
      if (mode_ == Mode::kPushPull && (c.pull_after() || c.last())) {
        auto read = std::make_shared<ReadItem>();
        read->request_id = c.request_id();
        read->index = item->index;
        read->round_last = c.last();
        if (!c.pull_after()) {
          read->terminator = true;
          QueueRead(std::move(read), true);
        } else {
          auto plan = handler_->PlanPullAfter(c);
          if (!plan.ok()) {
            Fail(plan.status());
          } else {
            read->plan = std::move(*plan);
            read->epoch = c.epoch();
            read->clock = c.pull_clock();
            read->worker = c.tag().worker();
            read->pull_view = c.pull_view();
            if (c.step_final() && !item->values.empty()) {
              read->own_worker = c.tag().worker();
              read->own_step = c.tag().step();
            }
            const auto& s = read->plan.slices[0];
            if (!item->values.empty() && c.indices().empty()) {
              read->first = c.offset();
              read->end = c.offset() + item->values.size() / DTypeSize(Job::TransportType(c.dtype()));
            } else if (!item->values.empty()) {
              read->first = 0;
              read->end = s.elems;
            } else {
              read->first = c.offset();
              read->end = s.elems;
            }
            read->next = read->first;
            QueueRead(std::move(read), true);
          }
        }
      }
    }
  }
  handler_->AddQueueDepth(-1);
  {
    absl::MutexLock l(&mu_);
    --queued_;
  }
  MaybeStartRead();
  MaybeComplete();
}

// ------------------------------------------------------------------ serving reads

void DataStream::StartPull(const grpc::ByteBuffer& request) {
  v1::PullRequest req;
  absl::Status st = ParseSmall(request, &req, "Pull: PullRequest");
  if (!st.ok()) {
    Fail(st);
    return;
  }
  if (!socket_) {
    st = CheckCallAuth(req.job_id(), req.worker());
    if (!st.ok()) {
      Fail(st);
      return;
    }
  }
  auto plan = handler_->PlanPull(req);
  if (!plan.ok()) {
    Fail(plan.status());
    return;
  }
  {
    absl::MutexLock l(&mu_);
    reads_done_ = true;
  }
  auto item = std::make_shared<ReadItem>();
  item->request_id = req.request_id();
  item->plan = std::move(*plan);
  item->epoch = req.epoch();
  item->clock = req.clock();
  item->round_last = true;
  if (item->plan.slices.empty()) {
    item->terminator = true;
  } else {
    item->end = item->plan.slices[0].elems;
  }
  QueueRead(std::move(item), false);
}

void DataStream::QueueRead(std::shared_ptr<ReadItem> item, bool run_inline) {
  {
    absl::MutexLock l(&mu_);
    ++reads_pending_;
  }
  handler_->AddQueueDepth(1);
  read_q_->Post(
      [self = shared_from_this(), item = std::move(item)](SerialQueue::Done done) {
        self->RunRead(item, std::move(done));
      },
      run_inline);
}

void DataStream::RunRead(const std::shared_ptr<ReadItem>& item, SerialQueue::Done done) {
  auto finish_item = [this, done] {
    handler_->AddQueueDepth(-1);
    {
      absl::MutexLock l(&mu_);
      --reads_pending_;
    }
    done();
    MaybeComplete();
  };
  bool finishing;
  {
    absl::MutexLock l(&mu_);
    finishing = finish_wanted_;
  }
  if (finishing) {
    finish_item();
    return;
  }
  if (item->terminator) {
    v1::PullChunk chunk;
    chunk.set_request_id(item->request_id);
    chunk.set_index(item->index);
    chunk.set_last(true);
    Write(EncodeWithPayload(chunk, kPullChunkValuesField, {}));
    if (mode_ == Mode::kPull) handler_->CountPullServed();
    finish_item();
    return;
  }
  const std::shared_ptr<Job>& job = item->plan.job;
  if (item->own_worker >= 0 &&
      job->ReadableAfterOwnPush(item->clock, static_cast<uint32_t>(item->own_worker),
                                item->own_step, &item->early_min)) {
    ContinueRead(item, absl::OkStatus(), finish_item);
    return;
  }
  uint64_t wait_id = 0;
  std::weak_ptr<DataStream> weak = shared_from_this();
  const absl::Time parked_at = absl::Now();
  bool ready = job->WhenReadable(
      item->clock,
      [weak, item, finish_item, parked_at](absl::Status st) {
        // Runs on the thread that advanced the clock: hand the read to the executor.
        if (auto self = weak.lock()) {
          self->handler_->AddTime(PsHandler::Phase::kPark, absl::Now() - parked_at);
          self->Schedule([self, item, finish_item, st] {
            self->ContinueRead(item, st, finish_item);
          });
        }
      },
      &wait_id);
  if (ready) {
    ContinueRead(item, absl::OkStatus(), finish_item);
    return;
  }
  bool cancel = false;
  {
    absl::MutexLock l(&mu_);
    if (finish_wanted_) {
      cancel = true;
    } else {
      parked_job_ = job;
      parked_id_ = wait_id;
    }
  }
  if (cancel && job->CancelWait(wait_id)) finish_item();
}

void DataStream::ContinueRead(const std::shared_ptr<ReadItem>& item, absl::Status st,
                              SerialQueue::Done done) {
  {
    absl::MutexLock l(&mu_);
    parked_job_.reset();
  }
  if (!st.ok()) {
    Fail(st);
    done();
    return;
  }
  item->min_clock = item->plan.job->RecordServedPull(item->clock, item->early_min);
  Produce(item, std::move(done));
}

void DataStream::Produce(const std::shared_ptr<ReadItem>& item, SerialQueue::Done done) {
  const v1::DataType dtype = item->plan.dtype;
  const size_t es = DTypeSize(dtype);
  while (true) {
    {
      absl::MutexLock l(&mu_);
      if (finish_wanted_) break;
      if (static_cast<int>(writes_.size()) >= options_.max_pending_writes) {
        paused_producer_ = [self = shared_from_this(), item, done] { self->Produce(item, done); };
        return;
      }
    }
    const SliceRef& s = item->plan.slices[item->slice];
    const uint64_t width = s.dense ? 1 : item->plan.job->table_width(s.table);
    uint64_t per_chunk = std::max<uint64_t>(width, options_.chunk_bytes / es / width * width);
    // A whole block read against the worker's view (pull compression) goes in one chunk.
    const bool view_read = s.dense && item->pull_view != 0 && item->next == 0 &&
                           item->end == s.elems && s.elems > 0;
    if (view_read) per_chunk = s.elems;
    uint64_t k = std::min<uint64_t>(per_chunk, item->end - item->next);
    const bool slice_done = item->next + k == item->end;
    const bool last_slice = item->slice + 1 == item->plan.slices.size();
    v1::PullChunk chunk;
    chunk.set_request_id(item->request_id);
    chunk.set_index(mode_ == Mode::kPull ? static_cast<uint32_t>(item->slice) : item->index);
    chunk.set_offset(item->next);
    chunk.set_dtype(dtype);
    chunk.set_min_clock(item->min_clock);
    chunk.set_last(item->round_last && slice_done && last_slice);
    std::vector<grpc::Slice> payload;
    const absl::Time t0 = absl::Now();
    if (view_read) {
      auto reply =
          item->plan.job->ReadView(s, item->epoch, item->worker, item->pull_view, dtype);
      if (!reply.ok()) {
        Fail(reply.status());
        break;
      }
      chunk.set_view(reply->view);
      chunk.set_indices(std::move(reply->indices));
      const size_t bytes = reply->values.size();
      BufferPool::Buffer buf = pool_->Acquire(std::max<size_t>(bytes, 1));
      std::memcpy(buf.data, reply->values.data(), bytes);
      payload.push_back(pool_->ToSlice(buf, bytes));
      handler_->CountBytesOut(bytes + chunk.indices().size());
    } else if (k > 0 && s.dense && dtype == v1::DT_FLOAT32) {
      // Dense float32 weights go out as they are (copy-on-write keeps them unchanged).
      auto lent = item->plan.job->Lend(s, item->epoch, item->next, k);
      if (!lent.ok()) {
        Fail(lent.status());
        break;
      }
      auto* owner = new std::shared_ptr<const void>(std::move(lent->owner));
      payload.emplace_back(const_cast<char*>(lent->data), lent->size,
                           [](void* p) { delete static_cast<std::shared_ptr<const void>*>(p); },
                           owner);
      handler_->CountBytesOut(k * es);
    } else if (k > 0) {
      BufferPool::Buffer buf = pool_->Acquire(k * es);
      absl::Status st = item->plan.job->Read(s, item->epoch, item->next, k, dtype, buf.data);
      if (!st.ok()) {
        pool_->Release(buf);
        Fail(st);
        break;
      }
      payload.push_back(pool_->ToSlice(buf, k * es));
      handler_->CountBytesOut(k * es);
    }
    grpc::ByteBuffer msg = EncodeWithPayload(chunk, kPullChunkValuesField, std::move(payload));
    handler_->AddTime(PsHandler::Phase::kRead, absl::Now() - t0);
    handler_->CountChunkOut();
    Write(std::move(msg));
    item->next += k;
    if (!slice_done) continue;
    if (last_slice) {
      if (mode_ == Mode::kPull) handler_->CountPullServed();
      break;
    }
    ++item->slice;
    item->first = item->next = 0;
    item->end = item->plan.slices[item->slice].elems;
  }
  done();
}

// ------------------------------------------------------------------ writing

void DataStream::Write(grpc::ByteBuffer msg) {
  {
    absl::MutexLock l(&mu_);
    if (finish_wanted_) return;
    writes_.push_back(std::move(msg));
    if (writing_) return;
    writing_ = true;
    current_write_ = std::move(writes_.front());
    writes_.pop_front();
    ++starting_;
  }
  ops_.start_write(&current_write_);
  EndOp();
}

void DataStream::OnWriteDone(bool ok) {
  std::function<void()> resume;
  bool start = false, finish = false;
  grpc::Status st;
  {
    absl::MutexLock l(&mu_);
    current_write_.Clear();
    if (!ok) {
      writes_.clear();
      if (!finish_wanted_) {
        finish_wanted_ = true;
        finish_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "write failed");
      }
    }
    if (!writes_.empty() && !finish_wanted_) {
      current_write_ = std::move(writes_.front());
      writes_.pop_front();
      ++starting_;
      start = true;
    } else if (!writes_.empty() && finish_status_.ok()) {
      // Finishing OK: flush what is queued first.
      current_write_ = std::move(writes_.front());
      writes_.pop_front();
      ++starting_;
      start = true;
    } else {
      writing_ = false;
    }
    if (paused_producer_ && static_cast<int>(writes_.size()) < options_.max_pending_writes) {
      resume = std::move(paused_producer_);
      paused_producer_ = nullptr;
    }
    finish = FinishDueLocked();
    st = finish_status_;
  }
  if (resume) Schedule(std::move(resume));
  if (start) {
    ops_.start_write(&current_write_);
    EndOp();
  }
  if (finish) ops_.finish(st);
  MaybeComplete();
}

}  // namespace pscluster
