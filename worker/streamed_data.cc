#include "worker/streamed_data.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/data/dataset_spec.h"

namespace pscluster::worker {

std::string StreamedData::Describe() const {
  return absl::StrCat(dataset->Describe(), "; ", train_lines, " training lines");
}

absl::StatusOr<std::unique_ptr<StreamedData>> OpenStreamedData(const v1::JobSpec& spec) {
  auto options = data::DatasetOptionsOf(spec.dataset(), spec.seed());
  if (!options.ok()) return options.status();
  auto out = std::make_unique<StreamedData>();
  out->fs = data::NewPosixFileSystem();
  auto ds = data::StreamingDataset::Open(*options, out->fs.get());
  if (!ds.ok()) {
    return absl::Status(ds.status().code(), absl::StrCat("dataset: ", ds.status().message()));
  }
  out->dataset = std::move(*ds);
  data::ReadRequest all;
  all.split = data::Split::kTrain;
  auto lines = out->dataset->CountLines(all);
  if (!lines.ok()) {
    return absl::Status(lines.status().code(),
                        absl::StrCat("dataset.train: ", lines.status().message()));
  }
  if (*lines == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset.train: ", options->train, ": the training split holds no lines"));
  }
  out->train_lines = static_cast<int64_t>(*lines);
  return out;
}

v1::ModelSpec CompleteStreamedModelSpec(const v1::ModelSpec& model, const data::Schema& schema) {
  v1::ModelSpec m = model;
  if (m.num_classes() == 0) m.set_num_classes(schema.num_classes);
  if (m.kind() == "graph") {
    // The graph's inputs: the dense features, the categorical fields and the key bound.
    m.set_input_dim(static_cast<uint32_t>(schema.dense.size()));
    m.clear_input_fields();
    for (const data::FieldInfo& f : schema.fields) {
      v1::InputField* field = m.add_input_fields();
      field->set_name(f.name);
      field->set_base(f.base);
      field->set_size(f.size);
    }
    m.set_key_space(schema.key_space);
    return m;
  }
  if (m.input_dim() == 0) {
    m.set_input_dim(m.kind() == "sparse_linear" ? static_cast<uint32_t>(schema.key_space)
                                                : static_cast<uint32_t>(schema.dense.size()));
  }
  return m;
}

kernels::Batch AsBatch(const data::ExampleBatch& b) {
  kernels::Batch out;
  out.num_examples = static_cast<int64_t>(b.size());
  out.dense = b.dense;
  out.offsets = b.offsets;
  out.keys = b.keys;
  out.values = b.values;
  out.labels = b.labels;
  return out;
}

absl::StatusOr<std::unique_ptr<StreamedTrainSource>> StreamedTrainSource::Create(
    const StreamedData* data, const data::PartitionSpec& part, uint32_t job_batch,
    int64_t steps_per_epoch) {
  data::ReadRequest r;
  r.split = data::Split::kTrain;
  r.part = part;
  auto lines = data->dataset->CountLines(r);
  if (!lines.ok()) return lines.status();
  if (*lines == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "partition: part ", part.index, " of ", part.count, " of dataset.train holds no lines ",
        "(fewer lines than workers?)"));
  }
  std::unique_ptr<StreamedTrainSource> s(
      new StreamedTrainSource(data, part, job_batch, steps_per_epoch));
  s->examples_ = static_cast<int64_t>(*lines);
  s->batch_ = RankBatch(part, job_batch, s->examples_);
  return s;
}

absl::Status StreamedTrainSource::StartPass(int64_t epoch, uint64_t skip) {
  finished_ = stats();
  reader_.reset();  // Joins the old reader's thread before a new one reads.
  request_ = data::ReadRequest();
  request_.split = data::Split::kTrain;
  request_.part = part_;
  request_.epoch = static_cast<uint32_t>(epoch);
  request_.skip_examples = skip;
  auto reader = data_->dataset->Read(request_);
  if (!reader.ok()) return reader.status();
  reader_ = std::move(*reader);
  reader_epoch_ = epoch;
  return absl::OkStatus();
}

absl::StatusOr<kernels::Batch> StreamedTrainSource::BatchFor(int64_t n) {
  const int64_t epoch = n / steps_per_epoch_, j = n % steps_per_epoch_;
  if (reader_ == nullptr || epoch != reader_epoch_ || n != next_step_) {
    if (pending_.has_value() && epoch != reader_epoch_) {
      part_ = std::move(*pending_);
      pending_.reset();
    }
    // The examples of the epoch's steps before j, wrapped around the part as the passes do.
    const uint64_t skip =
        static_cast<uint64_t>(j * batch_) % static_cast<uint64_t>(std::max<int64_t>(1, examples_));
    absl::Status s = StartPass(epoch, skip);
    if (!s.ok()) return s;
  }
  data::ExampleBatch& out = batches_[n & 1];
  out.Clear();
  out.dense_dim = static_cast<uint32_t>(data_->dataset->schema().dense.size());
  bool restarted = false;  // A pass that ends before one example: the part yields none.
  while (static_cast<int64_t>(out.size()) < batch_) {
    auto got = reader_->Next(static_cast<size_t>(batch_ - static_cast<int64_t>(out.size())),
                             &scratch_);
    if (!got.ok()) return got.status();
    if (*got == 0) {
      if (restarted) {
        return absl::DataLossError(absl::StrCat(
            "dataset.train: part ", part_.index, " of ", part_.count,
            " yielded no examples in a whole pass (every line malformed or held out?)"));
      }
      // The part is smaller than the epoch's steps read: it starts over, same order.
      absl::Status s = StartPass(epoch, 0);
      if (!s.ok()) return s;
      restarted = true;
      continue;
    }
    restarted = false;
    for (size_t i = 0; i < *got; ++i) out.AppendFrom(scratch_, i);
  }
  next_step_ = n + 1;
  return AsBatch(out);
}

absl::StatusOr<std::string> StreamedTrainSource::Repartition(const data::PartitionSpec& next) {
  data::ReadRequest r;
  r.split = data::Split::kTrain;
  r.part = next;
  auto lines = data_->dataset->CountLines(r);
  if (!lines.ok()) return lines.status();
  std::string when = "from the next epoch";
  const bool only_added = next.index == part_.index && next.count == part_.count &&
                          next.begin == part_.begin && next.end == part_.end &&
                          next.shares == part_.shares;
  if (only_added && reader_ != nullptr &&
      data_->dataset->AddParts(reader_.get(), request_, next).ok()) {
    part_ = next;
    request_.part = next;
    pending_.reset();
    when = "now";
  } else {
    pending_ = next;
  }
  examples_ = static_cast<int64_t>(*lines);
  batch_ = RankBatch(next, job_batch_, examples_);
  return absl::StrCat(when, " reads ", examples_, " lines (part ", next.index, " and ",
                      next.also.size(), " more of ", next.count,
                      next.shares.empty() ? "" : ", sized by speed", "), ", batch_, " per step");
}

DataStats StreamedTrainSource::stats() const {
  DataStats s = finished_;
  if (reader_ != nullptr) {
    const data::ReaderStats r = reader_->stats();
    s.bytes_read += r.bytes_read;
    s.lines += r.lines;
    s.skipped_lines += r.skipped_lines;
  }
  return s;
}

absl::Status StreamedTestSource::Start() {
  reader_.reset();
  data::ReadRequest r;
  r.split = data::Split::kTest;
  r.shuffle = false;
  auto reader = data_->dataset->Read(r);
  if (!reader.ok()) return reader.status();
  reader_ = std::move(*reader);
  return absl::OkStatus();
}

absl::StatusOr<kernels::Batch> StreamedTestSource::Next(int64_t max_examples) {
  if (reader_ == nullptr) return absl::FailedPreconditionError("test: Next before Start");
  auto got = reader_->Next(static_cast<size_t>(std::max<int64_t>(0, max_examples)), &batch_);
  if (!got.ok()) return got.status();
  if (*got == 0) return kernels::Batch();
  return AsBatch(batch_);
}

}  // namespace pscluster::worker
