// Unary gRPC methods served from the raw request bytes, parsed here.
//
// gRPC's typed callback handler answers a request whose bytes do not parse with UNIMPLEMENTED
// and no message, the answer for a method that does not exist, so a client suspects version
// skew. A service built on ParsedUnaryService parses every unary request itself: bytes that do
// not parse get INVALID_ARGUMENT naming the method and the message type, and every enum field is
// checked against its declared values (ValidateEnums) before a handler sees the request. With
// an Authorizer (SetAuthorizer), every call is authenticated and authorized against the
// authorization table (common/authz.h) before its bytes are even parsed. With a fence
// (SetSchedulerTermFence), a call from a deposed scheduler is refused next
// (common/scheduler_term.h).
//
//   class MyService final : public ParsedUnaryService<v1::Foo::Service> {
//    public:
//     MyService() : ParsedUnaryService("pscluster.v1.Foo") {
//       Serve<v1::BarRequest, v1::BarResponse>("Bar", [this](auto* ctx, auto& req, auto* resp,
//                                                           Done done) { done(Bar(req, resp)); });
//       CheckEveryUnaryMethodServed();
//     }
//   };
//
// Thread model: Serve() and CheckEveryUnaryMethodServed() run in the constructor, before the
// service is registered; the handlers run on gRPC's callback threads and must not block there
// (hand long work to an executor and call `done` from it).
#ifndef PSCLUSTER_COMMON_PARSED_UNARY_H_
#define PSCLUSTER_COMMON_PARSED_UNARY_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/audit_log.h"
#include "common/authz.h"
#include "common/metrics.h"
#include "common/scheduler_term.h"
#include "common/status_convert.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/impl/codegen/server_callback_handlers.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"

namespace pscluster {
namespace parsed_unary_internal {

// The unary method `name` of `service`, checked to take `in` and return `out`. A mismatch is a
// broken invariant of the caller's own code: logged and aborted at construction.
const google::protobuf::MethodDescriptor* FindUnaryMethod(
    const google::protobuf::ServiceDescriptor* service, absl::string_view name,
    const google::protobuf::Descriptor* in, const google::protobuf::Descriptor* out);
const google::protobuf::ServiceDescriptor* FindService(absl::string_view full_name);
// Parses `in` into `req` and validates its enums; INVALID_ARGUMENT naming `method` otherwise.
absl::Status ParseRequest(const grpc::ByteBuffer& in, google::protobuf::Message* req,
                          const google::protobuf::MethodDescriptor* method);
absl::Status SerializeResponse(const google::protobuf::Message& resp, grpc::ByteBuffer* out);
// The value of `m`'s string field "job_id" ("" when it has none).
std::string JobIdOf(const google::protobuf::Message& m);
// Aborts naming the unary methods of `service` not in `served`.
void CheckServed(const google::protobuf::ServiceDescriptor* service,
                 const std::vector<bool>& served);

}  // namespace parsed_unary_internal

template <typename Base>
class ParsedUnaryService : public Base {
 public:
  // Finishes a call: with `status`, and with the response when the status is OK.
  using Done = std::function<void(absl::Status)>;
  template <typename Req, typename Resp>
  using Handler =
      std::function<void(grpc::CallbackServerContext* ctx, const Req& req, Resp* resp, Done done)>;

  // `service_full_name`: the service as the .proto declares it, e.g. "pscluster.v1.Scheduler".
  explicit ParsedUnaryService(absl::string_view service_full_name)
      : service_(parsed_unary_internal::FindService(service_full_name)),
        served_(service_->method_count(), false),
        latency_(new std::atomic<Histogram*>[service_->method_count()]) {
    for (int i = 0; i < service_->method_count(); ++i) latency_[i].store(nullptr);
  }

  // Observes every unary call's duration, from its arrival to its answer (refusals included),
  // into the histogram family `name`{method="..."} of `registry`.
  // REQUIRES: after the derived constructor, before the service serves; `registry` outlives it.
  void ObserveLatency(MetricsRegistry* registry, const std::string& name) {
    for (int i = 0; i < service_->method_count(); ++i) {
      if (!served_[i]) continue;
      latency_[i].store(
          registry->AddHistogram(name,
                                 "Duration of the daemon's unary RPCs by method, from arrival to "
                                 "answer (refusals included).",
                                 absl::StrCat("method=\"", service_->method(i)->name(), "\"")),
          std::memory_order_release);
    }
  }

  // Records every refused call, and every call of a method that changes state (AuditedMethod),
  // in `log` (nullptr = none, the default). REQUIRES: before the service serves; `log` outlives
  // it.
  void SetAuditLog(AuditLog* log) { audit_ = log; }

  // Refuses the calls of a deposed scheduler (nullptr = none, the default). REQUIRES: before the
  // service serves; `fence` outlives it.
  void SetSchedulerTermFence(SchedulerTermFence* fence) { fence_ = fence; }

  // Counts the calls the audit log records (whether or not a log is written), by method and
  // answer, as the counter family `name`{method="...",code="..."} of `registry`. The counts are
  // kept by the service from its construction. REQUIRES: `registry` outlives the service.
  void ObserveAudit(MetricsRegistry* registry, const std::string& name) {
    std::shared_ptr<AuditCounts> counts = audit_counts_;
    registry->AddCounterCallback(
        name,
        "Calls recorded by the audit log (every refused call, and every call that changes "
        "state), by method and answer code.",
        [counts] { return counts->Samples(); });
  }
  const AuditCounts& audit_counts() const { return *audit_counts_; }

 protected:
  // Every call is checked by `authz` before it is parsed (nullptr = none, the default).
  // REQUIRES: called from the constructor of the derived service; `authz` outlives the service.
  void SetAuthorizer(const Authorizer* authz) { authz_ = authz; }
  const Authorizer* authorizer() const { return authz_; }

  // Serves unary method `method` with `handler`, which receives the parsed, enum-checked
  // request. REQUIRES: called from the constructor of the derived service.
  template <typename Req, typename Resp>
  void Serve(absl::string_view method, Handler<Req, Resp> handler) {
    const google::protobuf::MethodDescriptor* m = parsed_unary_internal::FindUnaryMethod(
        service_, method, Req::descriptor(), Resp::descriptor());
    served_[m->index()] = true;
    this->MarkMethodRawCallback(
        m->index(),
        new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
            [this, m, handler = std::move(handler)](grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* in,
                                                    grpc::ByteBuffer* out) {
              grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
              Histogram* const latency = latency_[m->index()].load(std::memory_order_acquire);
              const absl::Time arrived = latency != nullptr ? absl::Now() : absl::InfinitePast();
              auto call = std::make_shared<std::pair<Req, Resp>>();
              // The audit record (filled as it goes; its text fields only when a log is written).
              auto audit = std::make_shared<AuditRecord>();
              AuditLog* const audit_log = audit_;
              if (audit_log != nullptr) {
                audit->time = absl::Now();
                audit->peer = ctx->peer();
                audit->method = m->full_name();
              }
              AuditCounts* const counts = audit_counts_.get();
              const bool audited = AuditedMethod(m->full_name());
              auto finish = [reactor, latency, arrived, audit, audit_log, counts, audited, m,
                             call](const absl::Status& s) {
                if (latency != nullptr) latency->ObserveSeconds(absl::Now() - arrived);
                if (audited || s.code() == absl::StatusCode::kUnauthenticated ||
                    (s.code() == absl::StatusCode::kPermissionDenied && !audit->checked)) {
                  counts->Count(m->full_name(), s.code());
                  if (audit_log != nullptr) {
                    audit->status = s;
                    audit->job_id = parsed_unary_internal::JobIdOf(call->first);
                    audit_log->Record(*audit);
                  }
                }
                reactor->Finish(ToGrpcStatus(s));
              };
              if (authz_ != nullptr) {
                absl::Status allowed =
                    authz_->Check(*ctx, m->full_name(), audit_log ? &audit->identity : nullptr);
                if (!allowed.ok()) {
                  finish(allowed);
                  return reactor;
                }
              }
              audit->checked = true;
              if (SchedulerTermFence* fence = fence_; fence != nullptr) {
                absl::Status admitted = fence->Admit(*ctx, m->full_name());
                if (!admitted.ok()) {
                  finish(admitted);
                  return reactor;
                }
              }
              absl::Status parsed = parsed_unary_internal::ParseRequest(*in, &call->first, m);
              if (!parsed.ok()) {
                finish(parsed);
                return reactor;
              }
              handler(ctx, call->first, &call->second, [finish, call, out](absl::Status s) {
                if (s.ok()) s = parsed_unary_internal::SerializeResponse(call->second, out);
                finish(s);
              });
              return reactor;
            }));
  }

  // Aborts when a unary method of the service was not given to Serve(): it would be answered
  // by gRPC's typed handler. REQUIRES: the last call of the derived service's constructor.
  void CheckEveryUnaryMethodServed() const {
    parsed_unary_internal::CheckServed(service_, served_);
  }

 private:
  const google::protobuf::ServiceDescriptor* const service_;
  std::vector<bool> served_;
  std::unique_ptr<std::atomic<Histogram*>[]> latency_;  // By method index; null: not observed.
  const Authorizer* authz_ = nullptr;
  AuditLog* audit_ = nullptr;
  SchedulerTermFence* fence_ = nullptr;
  const std::shared_ptr<AuditCounts> audit_counts_ = std::make_shared<AuditCounts>();
};

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_PARSED_UNARY_H_
