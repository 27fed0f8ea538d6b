#include "common/parsed_unary.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/validate_enums.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/proto_buffer_writer.h"

namespace pscluster::parsed_unary_internal {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "parsed_unary: %s\n", what.c_str());
  std::abort();
}

}  // namespace

const google::protobuf::ServiceDescriptor* FindService(absl::string_view full_name) {
  const auto* s = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
      std::string(full_name));
  if (s == nullptr) Die(absl::StrCat("no service ", full_name, " is linked in"));
  return s;
}

const google::protobuf::MethodDescriptor* FindUnaryMethod(
    const google::protobuf::ServiceDescriptor* service, absl::string_view name,
    const google::protobuf::Descriptor* in, const google::protobuf::Descriptor* out) {
  const auto* m = service->FindMethodByName(std::string(name));
  if (m == nullptr) Die(absl::StrCat(service->full_name(), " has no method ", name));
  if (m->client_streaming() || m->server_streaming()) {
    Die(absl::StrCat(m->full_name(), " streams; only unary methods are served parsed"));
  }
  if (m->input_type() != in || m->output_type() != out) {
    Die(absl::StrCat(m->full_name(), " takes ", m->input_type()->full_name(), " and returns ",
                     m->output_type()->full_name(), ", not ", in->full_name(), " and ",
                     out->full_name()));
  }
  return m;
}

absl::Status ParseRequest(const grpc::ByteBuffer& in, google::protobuf::Message* req,
                          const google::protobuf::MethodDescriptor* method) {
  grpc::ByteBuffer copy(in);  // Shares the slices; the reader needs a mutable buffer.
  grpc::ProtoBufferReader reader(&copy);
  if (!reader.status().ok() || !req->ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(absl::StrCat(
        method->full_name(), ": the request (", in.Length(), " bytes) does not parse as ",
        method->input_type()->full_name()));
  }
  absl::Status enums = ValidateEnums(*req);
  if (!enums.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(enums.message(), " (in ", method->full_name(), ")"));
  }
  return absl::OkStatus();
}

absl::Status SerializeResponse(const google::protobuf::Message& resp, grpc::ByteBuffer* out) {
  bool own = false;
  grpc::Status s = grpc::SerializationTraits<google::protobuf::Message>::Serialize(resp, out, &own);
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat("could not serialize the response ",
                                            resp.GetDescriptor()->full_name(), ": ",
                                            s.error_message()));
  }
  return absl::OkStatus();
}

std::string JobIdOf(const google::protobuf::Message& m) {
  const google::protobuf::FieldDescriptor* f = m.GetDescriptor()->FindFieldByName("job_id");
  if (f == nullptr || f->type() != google::protobuf::FieldDescriptor::TYPE_STRING ||
      f->is_repeated()) {
    return "";
  }
  return m.GetReflection()->GetString(m, f);
}

void CheckServed(const google::protobuf::ServiceDescriptor* service,
                 const std::vector<bool>& served) {
  std::vector<std::string> missing;
  for (int i = 0; i < service->method_count(); ++i) {
    const auto* m = service->method(i);
    if (!m->client_streaming() && !m->server_streaming() && !served[i]) {
      missing.push_back(m->name());
    }
  }
  if (!missing.empty()) {
    Die(absl::StrCat(service->full_name(), ": unary methods not served parsed: ",
                     absl::StrJoin(missing, ", ")));
  }
}

}  // namespace pscluster::parsed_unary_internal
