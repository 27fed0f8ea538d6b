// Random protobuf messages for fuzz tests: every field of a request filled (or left unset) at
// random with the edge values of its type (0, -1, the type's limits, NaN and infinity, unknown
// enum values), strings from a pool (settable: keep paths inside the test's directory), repeated
// fields of 0-3 entries and nested messages down to depth 4. Deterministic for a seed.
#ifndef PSCLUSTER_COMMON_TESTING_MESSAGE_FUZZER_H_
#define PSCLUSTER_COMMON_TESTING_MESSAGE_FUZZER_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"

namespace pscluster::testing {

// Fills messages with random values; strings come from the pool, or from the ids of real
// objects added with AddKnown().
class MessageFuzzer {
 public:
  explicit MessageFuzzer(uint64_t seed) : rng_(seed) {}

  // Replaces the default string pool.
  void SetStrings(std::vector<std::string> pool) { pool_ = std::move(pool); }

  void AddKnown(const std::string& s) { known_.push_back(s); }

  void Fill(google::protobuf::Message* m, int depth = 0) {
    using google::protobuf::FieldDescriptor;
    const google::protobuf::Descriptor* d = m->GetDescriptor();
    const google::protobuf::Reflection* r = m->GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (Pick(3) == 0) continue;  // Left unset.
      const int n = f->is_repeated() ? Pick(4) : 1;
      for (int k = 0; k < n; ++k) {
        const bool rep = f->is_repeated();
        switch (f->cpp_type()) {
          case FieldDescriptor::CPPTYPE_INT32: {
            const int32_t v[] = {0, 1, -1, 2, 7, std::numeric_limits<int32_t>::max(),
                                 std::numeric_limits<int32_t>::min()};
            const int32_t x = v[Pick(7)];
            rep ? r->AddInt32(m, f, x) : r->SetInt32(m, f, x);
            break;
          }
          case FieldDescriptor::CPPTYPE_INT64: {
            const int64_t v[] = {0, 1, -1, 3, 1000000000000, std::numeric_limits<int64_t>::max(),
                                 std::numeric_limits<int64_t>::min()};
            const int64_t x = v[Pick(7)];
            rep ? r->AddInt64(m, f, x) : r->SetInt64(m, f, x);
            break;
          }
          case FieldDescriptor::CPPTYPE_UINT32: {
            const uint32_t v[] = {0, 1, 2, 64, 100000, std::numeric_limits<uint32_t>::max()};
            const uint32_t x = v[Pick(6)];
            rep ? r->AddUInt32(m, f, x) : r->SetUInt32(m, f, x);
            break;
          }
          case FieldDescriptor::CPPTYPE_UINT64: {
            const uint64_t v[] = {0, 1, 2, 1ull << 40, std::numeric_limits<uint64_t>::max()};
            const uint64_t x = v[Pick(5)];
            rep ? r->AddUInt64(m, f, x) : r->SetUInt64(m, f, x);
            break;
          }
          case FieldDescriptor::CPPTYPE_DOUBLE:
          case FieldDescriptor::CPPTYPE_FLOAT: {
            const double v[] = {0.0, -1.0, 0.5, 1e300, std::numeric_limits<double>::quiet_NaN(),
                                std::numeric_limits<double>::infinity(), -0.0};
            const double x = v[Pick(7)];
            if (f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
              rep ? r->AddDouble(m, f, x) : r->SetDouble(m, f, x);
            } else {
              const float y = static_cast<float>(x);
              rep ? r->AddFloat(m, f, y) : r->SetFloat(m, f, y);
            }
            break;
          }
          case FieldDescriptor::CPPTYPE_BOOL: {
            const bool x = Pick(2) == 0;
            rep ? r->AddBool(m, f, x) : r->SetBool(m, f, x);
            break;
          }
          case FieldDescriptor::CPPTYPE_ENUM: {
            const int x = Pick(12) - 1;  // Known values and unknown ones (proto3 keeps them).
            rep ? r->AddEnumValue(m, f, x) : r->SetEnumValue(m, f, x);
            break;
          }
          case FieldDescriptor::CPPTYPE_STRING: {
            const std::string x = String();
            rep ? r->AddString(m, f, x) : r->SetString(m, f, x);
            break;
          }
          case FieldDescriptor::CPPTYPE_MESSAGE: {
            if (depth >= 4) break;
            Fill(rep ? r->AddMessage(m, f) : r->MutableMessage(m, f), depth + 1);
            break;
          }
        }
      }
    }
  }

  int Pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }

 private:
  std::string String() {
    if (!known_.empty() && Pick(3) == 0) return known_[rng_() % known_.size()];
    if (Pick(10) == 0) return std::string(100000, 'z');
    return pool_[rng_() % pool_.size()];
  }

  std::mt19937_64 rng_;
  std::vector<std::string> known_;
  std::vector<std::string> pool_ = {"", "x", "127.0.0.1:1", "127.0.0.1:0", "[::1]:1", "no-port",
                                    ":", "host:99999", "job-1", "name: x\nepochs: [",
                                    "job-\xff\xfe", "n\x01\x02"};
};

// A small valid job file (MLP on Fashion-MNIST, 1 server, 1 worker, 1 epoch) that fuzz tests damage
// or start tasks from.
inline constexpr char kFuzzJobYaml[] = R"(name: fuzz-job
model: {kind: mlp, hidden: [16]}
dataset: {name: fashion_mnist}
optimizer: {kind: adam, learning_rate: 0.001}
consistency: {mode: bsp}
num_servers: 1
num_workers: 1
epochs: 1
batch_size: 32
)";

// Calls per fuzz run: `fallback`, or PSCLUSTER_FUZZ_ITERATIONS for longer runs by hand.
inline int FuzzIterations(int fallback) {
  const char* env = std::getenv("PSCLUSTER_FUZZ_ITERATIONS");
  return env != nullptr ? std::max(1, std::atoi(env)) : fallback;
}

// Whether a call ended with a status of the daemon's own: not a deadline (it hung), not
// UNAVAILABLE (the connection or the daemon went down), not INTERNAL (a bug), and not the
// client's refusal of an oversized status message.
inline ::testing::AssertionResult IsOwnStatus(const grpc::Status& st) {
  if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
      st.error_code() == grpc::StatusCode::UNAVAILABLE ||
      st.error_code() == grpc::StatusCode::INTERNAL ||
      st.error_message().find("metadata size exceeds") != std::string::npos) {
    return ::testing::AssertionFailure() << "status " << st.error_code() << ": "
                                         << st.error_message();
  }
  return ::testing::AssertionSuccess();
}

// How the calls of a fuzz run ended, by RPC and status code.
class CallTally {
 public:
  void Record(const std::string& rpc, const grpc::Status& st) {
    ++counts_[rpc + " " + std::to_string(st.error_code())];
  }
  int Count(const std::string& rpc, grpc::StatusCode code) const {
    auto it = counts_.find(rpc + " " + std::to_string(code));
    return it == counts_.end() ? 0 : it->second;
  }
  std::string Summary() const {
    std::string out;
    for (const auto& [what, n] : counts_) out += " [" + what + "] " + std::to_string(n);
    return out;
  }

 private:
  std::map<std::string, int> counts_;
};

// Makes `calls` fuzz calls: `call(i, ctx, &rpc)` makes call i with `ctx` (deadline `deadline`),
// names its RPC and returns its status. Stops with a test failure at the first status that is not
// the daemon's own (IsOwnStatus). Returns how the calls ended, printed too.
template <typename Call>
CallTally RunFuzzCalls(int calls, absl::Duration deadline, Call call) {
  CallTally tally;
  for (int i = 0; i < calls; ++i) {
    SCOPED_TRACE(absl::StrCat("call ", i));
    auto ctx = CallContext(deadline);
    std::string rpc;
    const grpc::Status st = call(i, ctx.get(), &rpc);
    tally.Record(rpc, st);
    if (!IsOwnStatus(st)) {
      ADD_FAILURE() << rpc << ": " << IsOwnStatus(st).message();
      break;
    }
  }
  std::printf("calls by RPC and status code:%s\n", tally.Summary().c_str());
  return tally;
}

}  // namespace pscluster::testing

#endif  // PSCLUSTER_COMMON_TESTING_MESSAGE_FUZZER_H_
