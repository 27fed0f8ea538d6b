// Checks the contracts themselves: every request and response message of every pscluster.v1
// RPC survives a serialise/parse round trip with all of its fields set, and every message, field
// and RPC carries a comment (read from a descriptor set built with source info).
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/message_differencer.h"
#include "proto/grpc_health.pb.h"
#include "proto/ps.pb.h"
#include "proto/scheduler.pb.h"
#include "proto/worker.pb.h"

namespace pscluster {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::DescriptorPool;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::MessageFactory;
using google::protobuf::Reflection;

constexpr const char* kServices[] = {"pscluster.v1.ParameterServer", "pscluster.v1.Scheduler",
                                     "pscluster.v1.WorkerControl"};

// Sets every field of `m` (and of nested messages, up to `depth`) to a value derived from `seed`,
// taking the first member of each oneof (and, on a second pass, the others; see FillOneofMember).
void Fill(Message* m, int seed, int depth) {
  const Descriptor* d = m->GetDescriptor();
  const Reflection* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->containing_oneof() != nullptr && f->index_in_oneof() != (seed % f->containing_oneof()->field_count())) {
      continue;
    }
    int v = seed * 31 + i + 1;
    auto set_one = [&](bool repeated) {
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_INT32:
          repeated ? r->AddInt32(m, f, -v) : r->SetInt32(m, f, -v);
          break;
        case FieldDescriptor::CPPTYPE_INT64:
          repeated ? r->AddInt64(m, f, -(int64_t{v} << 33))
                   : r->SetInt64(m, f, -(int64_t{v} << 33));
          break;
        case FieldDescriptor::CPPTYPE_UINT32:
          repeated ? r->AddUInt32(m, f, 4000000000u - v) : r->SetUInt32(m, f, 4000000000u - v);
          break;
        case FieldDescriptor::CPPTYPE_UINT64:
          repeated ? r->AddUInt64(m, f, ~uint64_t{0} - v) : r->SetUInt64(m, f, ~uint64_t{0} - v);
          break;
        case FieldDescriptor::CPPTYPE_DOUBLE:
          repeated ? r->AddDouble(m, f, v * 0.25) : r->SetDouble(m, f, v * 0.25);
          break;
        case FieldDescriptor::CPPTYPE_FLOAT:
          repeated ? r->AddFloat(m, f, v * 0.5f) : r->SetFloat(m, f, v * 0.5f);
          break;
        case FieldDescriptor::CPPTYPE_BOOL:
          repeated ? r->AddBool(m, f, true) : r->SetBool(m, f, true);
          break;
        case FieldDescriptor::CPPTYPE_ENUM: {
          const auto* e = f->enum_type();
          int n = e->value(e->value_count() - 1)->number();
          repeated ? r->AddEnumValue(m, f, n) : r->SetEnumValue(m, f, n);
          break;
        }
        case FieldDescriptor::CPPTYPE_STRING: {
          std::string s = "s" + std::to_string(v);
          if (f->type() == FieldDescriptor::TYPE_BYTES) s += std::string("\0\xff\x80", 3);
          repeated ? r->AddString(m, f, s) : r->SetString(m, f, s);
          break;
        }
        case FieldDescriptor::CPPTYPE_MESSAGE:
          if (depth > 0) {
            Message* sub = repeated ? r->AddMessage(m, f) : r->MutableMessage(m, f);
            Fill(sub, seed + i, depth - 1);
          }
          break;
      }
    };
    if (f->is_repeated()) {
      set_one(true);
      set_one(true);
    } else {
      set_one(false);
    }
  }
}

std::set<const Descriptor*> RpcMessages() {
  std::set<const Descriptor*> out;
  // Force-link the generated files so their descriptors are in the generated pool.
  (void)v1::PullRequest::descriptor();
  (void)v1::SubmitJobRequest::descriptor();
  (void)v1::AssignTaskRequest::descriptor();
  for (const char* name : kServices) {
    const auto* svc = DescriptorPool::generated_pool()->FindServiceByName(name);
    EXPECT_NE(svc, nullptr) << name;
    if (svc == nullptr) continue;
    for (int i = 0; i < svc->method_count(); ++i) {
      out.insert(svc->method(i)->input_type());
      out.insert(svc->method(i)->output_type());
    }
  }
  return out;
}

TEST(ProtoContractTest, EveryRpcMessageRoundTripsWithAllFieldsSet) {
  auto messages = RpcMessages();
  EXPECT_GE(messages.size(), 30u);
  for (const Descriptor* d : messages) {
    for (int seed = 0; seed < 3; ++seed) {  // Seeds pick different oneof members.
      std::unique_ptr<Message> in(MessageFactory::generated_factory()->GetPrototype(d)->New());
      Fill(in.get(), seed, 4);
      std::string wire;
      ASSERT_TRUE(in->SerializeToString(&wire)) << d->full_name();
      std::unique_ptr<Message> out(in->New());
      ASSERT_TRUE(out->ParseFromString(wire)) << d->full_name();
      EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*in, *out))
          << d->full_name() << "\nin:  " << in->ShortDebugString()
          << "\nout: " << out->ShortDebugString();
      // Each non-empty request really carries its fields (nothing silently dropped).
      if (d->field_count() > 0) {
        EXPECT_FALSE(wire.empty()) << d->full_name();
      }
    }
  }
}

TEST(ProtoContractTest, TruncatedMessagesAreRejectedNotMisread) {
  v1::PushChunk chunk;
  Fill(&chunk, 1, 3);
  chunk.set_values(std::string(1000, 'x'));
  std::string wire = chunk.SerializeAsString();
  v1::PushChunk parsed;
  EXPECT_FALSE(parsed.ParseFromString(wire.substr(0, wire.size() - 10)));
}

TEST(ProtoContractTest, EveryMessageFieldAndRpcIsCommented) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  ASSERT_NE(srcdir, nullptr);
  std::string path = std::string(srcdir) + "/pscluster/proto/contracts_with_comments.pb";
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  google::protobuf::FileDescriptorSet set;
  ASSERT_TRUE(set.ParseFromString(ss.str()));
  int checked = 0;
  for (const auto& file : set.file()) {
    if (file.name().rfind("proto/", 0) != 0) continue;
    // Map each element path to whether it has a comment.
    std::set<std::vector<int>> commented;
    for (const auto& loc : file.source_code_info().location()) {
      if (!loc.leading_comments().empty() || !loc.trailing_comments().empty()) {
        commented.insert(std::vector<int>(loc.path().begin(), loc.path().end()));
      }
    }
    // FileDescriptorProto field numbers: message_type = 4, service = 6; DescriptorProto
    // field = 2; ServiceDescriptorProto method = 2.
    for (int s = 0; s < file.service_size(); ++s) {
      for (int m = 0; m < file.service(s).method_size(); ++m) {
        ++checked;
        EXPECT_TRUE(commented.count({6, s, 2, m}))
            << file.name() << ": rpc " << file.service(s).method(m).name() << " has no comment";
      }
    }
    for (int t = 0; t < file.message_type_size(); ++t) {
      const auto& msg = file.message_type(t);
      for (int f = 0; f < msg.field_size(); ++f) {
        ++checked;
        bool ok = commented.count({4, t, 2, f}) > 0;
        EXPECT_TRUE(ok) << file.name() << ": " << msg.name() << "." << msg.field(f).name()
                        << " has no comment";
      }
    }
  }
  EXPECT_GT(checked, 150);
}

}  // namespace
}  // namespace pscluster
