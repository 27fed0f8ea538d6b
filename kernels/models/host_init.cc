#include "kernels/models/host_init.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace pscluster::kernels {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t NameHash(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a.
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Uniform in (0, 1), from a counter.
double Uniform01(uint64_t stream, uint64_t counter) {
  const uint64_t bits = SplitMix(stream ^ SplitMix(counter));
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

float Draw(const v1::InitializerSpec& init, uint64_t stream, uint64_t index) {
  switch (init.kind()) {
    case v1::InitializerSpec::CONSTANT:
      return init.value();
    case v1::InitializerSpec::UNIFORM:
      return static_cast<float>(init.low() + (init.high() - init.low()) * Uniform01(stream, index));
    case v1::InitializerSpec::NORMAL: {
      // Box-Muller from two independent counters.
      const double u1 = Uniform01(stream, 2 * index), u2 = Uniform01(stream, 2 * index + 1);
      const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
      return static_cast<float>(init.mean() + init.stddev() * z);
    }
    default:
      return 0.0f;
  }
}

absl::Status CheckConcrete(const ParamInfo& p) {
  switch (p.init.kind()) {
    case v1::InitializerSpec::ZEROS:
    case v1::InitializerSpec::CONSTANT:
    case v1::InitializerSpec::UNIFORM:
    case v1::InitializerSpec::NORMAL:
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(p.name, ": initializer kind ", p.init.kind(),
                       " is not concrete (models resolve Glorot/He to UNIFORM/NORMAL)"));
  }
}

}  // namespace

absl::Status InitializeDense(const ParamInfo& p, absl::Span<float> out) {
  if (p.sparse || static_cast<int64_t>(out.size()) != p.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(p.name, ": not a dense parameter of ",
                                                   out.size(), " elements"));
  }
  if (absl::Status s = CheckConcrete(p); !s.ok()) return s;
  const uint64_t stream = SplitMix(p.init.seed() ^ NameHash(p.name));
  for (size_t i = 0; i < out.size(); ++i) out[i] = Draw(p.init, stream, i);
  return absl::OkStatus();
}

absl::Status InitializeRows(const ParamInfo& p, absl::Span<const uint64_t> keys,
                            absl::Span<float> out) {
  if (!p.sparse || out.size() != keys.size() * p.row_width) {
    return absl::InvalidArgumentError(absl::StrCat(p.name, ": not a sparse parameter with ",
                                                   keys.size(), " rows of ", p.row_width));
  }
  if (absl::Status s = CheckConcrete(p); !s.ok()) return s;
  const uint64_t stream = SplitMix(p.init.seed() ^ NameHash(p.name));
  for (size_t r = 0; r < keys.size(); ++r) {
    const uint64_t row_stream = SplitMix(stream ^ keys[r]);
    for (int64_t c = 0; c < p.row_width; ++c) {
      out[r * p.row_width + c] = Draw(p.init, row_stream, static_cast<uint64_t>(c));
    }
  }
  return absl::OkStatus();
}

HostParams::HostParams(const Model& model)
    : params_(model.params()),
      dense_(params_.size()),
      row_index_(params_.size()),
      row_values_(params_.size()),
      step_keys_(params_.size()),
      step_rows_(params_.size()),
      grad_storage_(params_.size()) {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].sparse) continue;
    dense_[i].resize(params_[i].num_elements());
    InitializeDense(params_[i], absl::MakeSpan(dense_[i])).IgnoreError();  // Concrete by design.
  }
}

absl::StatusOr<ParamValues> HostParams::Gather(const std::vector<std::vector<uint64_t>>& keys) {
  if (keys.size() != params_.size()) {
    return absl::InvalidArgumentError("keys must have one entry per parameter");
  }
  ParamValues v;
  v.keys.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    if (!p.sparse) {
      v.values.push_back(absl::MakeConstSpan(dense_[i]));
      continue;
    }
    const int64_t w = p.row_width;
    step_keys_[i] = keys[i];
    step_rows_[i].resize(keys[i].size() * w);
    std::vector<uint64_t> fresh;
    for (uint64_t k : keys[i]) {
      if (!row_index_[i].contains(k)) fresh.push_back(k);
    }
    if (!fresh.empty()) {
      std::vector<float> rows(fresh.size() * w);
      if (absl::Status s = InitializeRows(p, fresh, absl::MakeSpan(rows)); !s.ok()) return s;
      for (size_t r = 0; r < fresh.size(); ++r) {
        row_index_[i][fresh[r]] = row_values_[i].size() / w;
        row_values_[i].insert(row_values_[i].end(), rows.begin() + r * w, rows.begin() + (r + 1) * w);
      }
    }
    for (size_t r = 0; r < keys[i].size(); ++r) {
      const size_t row = row_index_[i].at(keys[i][r]);
      std::copy_n(row_values_[i].begin() + row * w, w, step_rows_[i].begin() + r * w);
    }
    v.values.push_back(absl::MakeConstSpan(step_rows_[i]));
    v.keys[i] = absl::MakeConstSpan(step_keys_[i]);
  }
  return v;
}

Gradients HostParams::GradientBuffers() {
  Gradients g;
  for (size_t i = 0; i < params_.size(); ++i) {
    const size_t size = params_[i].sparse ? step_rows_[i].size() : dense_[i].size();
    grad_storage_[i].resize(size);
    g.values.push_back(absl::MakeSpan(grad_storage_[i]));
  }
  return g;
}

void HostParams::ApplySgd(const Gradients& grads, float learning_rate) {
  for (size_t i = 0; i < params_.size(); ++i) {
    absl::Span<float> g = grads.values[i];
    if (!params_[i].sparse) {
      for (size_t j = 0; j < g.size(); ++j) dense_[i][j] -= learning_rate * g[j];
      continue;
    }
    const int64_t w = params_[i].row_width;
    for (size_t r = 0; r < step_keys_[i].size(); ++r) {
      float* row = row_values_[i].data() + row_index_[i].at(step_keys_[i][r]) * w;
      for (int64_t c = 0; c < w; ++c) row[c] -= learning_rate * g[r * w + c];
    }
  }
}

}  // namespace pscluster::kernels
