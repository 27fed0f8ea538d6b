// Baselines the parameter-server benchmark is measured against in the same run: a raw TCP echo
// over loopback and a bare gRPC bidirectional-stream echo (raw byte buffers, no protobuf
// copies). The echo servers run in their own process, as ps_server does.
#ifndef PSCLUSTER_TESTS_BENCH_PS_BENCH_BASELINES_H_
#define PSCLUSTER_TESTS_BENCH_PS_BENCH_BASELINES_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pscluster {
namespace bench {

// Runs an echo server until killed: "tcp" or "grpc"; writes host:port to port_file.
int ServeEcho(const std::string& kind, const std::string& port_file,
              const std::vector<std::pair<std::string, int>>& grpc_args);

// Seconds per round trip of `bytes` (sent, echoed, received into a buffer).
class EchoClient {
 public:
  virtual ~EchoClient() = default;
  virtual absl::StatusOr<double> Round(size_t bytes) = 0;
};
absl::StatusOr<std::unique_ptr<EchoClient>> ConnectTcpEcho(const std::string& address);
// Messages of at most `chunk_bytes`, several in flight, replies copied into a buffer.
absl::StatusOr<std::unique_ptr<EchoClient>> ConnectGrpcEcho(
    const std::string& address, size_t chunk_bytes,
    const std::vector<std::pair<std::string, int>>& grpc_args);

}  // namespace bench
}  // namespace pscluster

#endif  // PSCLUSTER_TESTS_BENCH_PS_BENCH_BASELINES_H_
