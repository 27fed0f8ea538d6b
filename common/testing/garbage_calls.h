// Sends bytes that parse as no message to every method of a service, enumerated from its
// descriptor (so a new method is covered without new test code), and checks each answer:
// INVALID_ARGUMENT naming the method, within a deadline; never UNIMPLEMENTED (the answer for a
// method that does not exist) and never a dropped connection.
#ifndef PSCLUSTER_COMMON_TESTING_GARBAGE_CALLS_H_
#define PSCLUSTER_COMMON_TESTING_GARBAGE_CALLS_H_

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"

namespace pscluster::testing {

inline void ExpectEveryMethodRefusesGarbage(const std::shared_ptr<grpc::Channel>& channel,
                                            const std::string& service_full_name) {
  const auto* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service_full_name);
  ASSERT_NE(service, nullptr) << service_full_name;
  grpc::GenericStub stub(channel);
  // Field 1, length-delimited, with a length far past the end.
  const std::string bytes = "\x0a\xff\xff\xff\xff\x0f garbage";
  for (int i = 0; i < service->method_count(); ++i) {
    const auto* m = service->method(i);
    SCOPED_TRACE(m->full_name());
    grpc::Slice slice(bytes);
    grpc::ByteBuffer junk(&slice, 1), out;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    absl::Notification done;
    grpc::Status status;
    stub.UnaryCall(&ctx, "/" + service_full_name + "/" + m->name(), grpc::StubOptions(), &junk,
                   &out, [&](grpc::Status st) {
                     status = st;
                     done.Notify();
                   });
    done.WaitForNotification();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_NE(status.error_message().find(m->name()), std::string::npos)
        << "the message names the method: " << status.error_message();
  }
}

}  // namespace pscluster::testing

#endif  // PSCLUSTER_COMMON_TESTING_GARBAGE_CALLS_H_
