#include "common/channel.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/client_interceptor.h"

namespace pscluster {
namespace {

// gRPC 1.51 on Linux completes callback-API operations on one process-wide "callback
// alternative" completion queue, created with the first channel that makes a callback call and
// torn down when the last such channel (or callback server) goes away. Tearing it down and
// creating the next one while the old queue's threads still drain frees memory twice (seen as
// heap corruption in processes that create and drop PsClients one after another). One channel
// that has made a callback call is kept for the life of the process, so the shared queue is
// never torn down. It connects to nothing: its single call fails at once.
void AnchorCallbackQueue() {
  static std::once_flag once;
  std::call_once(once, [] {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 1000);
    // Intentionally leaked: it must outlive every other channel.
    auto* channel = new std::shared_ptr<grpc::Channel>(
        grpc::CreateCustomChannel("127.0.0.1:1", grpc::InsecureChannelCredentials(), args));
    grpc::GenericStub stub(*channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1));
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1), response;
    absl::Notification done;
    stub.UnaryCall(&ctx, "/pscluster.v1.Anchor/Noop", grpc::StubOptions(), &request, &response,
                   [&done](grpc::Status) { done.Notify(); });
    done.WaitForNotification();
  });
}

// Adds "authorization: Bearer <token>" to every call of a channel, unary and streaming alike.
// An interceptor rather than call credentials: gRPC sends call credentials only over secure
// channels, and a plaintext cluster with tokens must still authenticate.
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      auto* md = methods->GetSendInitialMetadata();
      if (md != nullptr && md->find("authorization") == md->end()) {
        md->emplace("authorization", *header_);
      }
    }
    methods->Proceed();
  }

 private:
  const std::string* const header_;
};

class BearerTokenFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(const std::string& token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(&header_);
  }

 private:
  const std::string header_;
};

// Several addresses ("10.0.0.1:7070,10.0.0.2:7070"): one gRPC target over all of them
// ("ipv4:10.0.0.1:7070,10.0.0.2:7070"), host names resolved here once.
absl::StatusOr<std::string> MultiAddressTarget(const std::string& list) {
  std::vector<std::string> v4, v6;
  for (absl::string_view entry : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    const size_t colon = entry.rfind(':');
    if (colon == absl::string_view::npos || colon == 0 || colon + 1 == entry.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("address '", entry, "' in the list '", list, "' must be host:port"));
    }
    std::string host(entry.substr(0, colon));
    const std::string port(entry.substr(colon + 1));
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      v6.push_back(absl::StrCat(host, ":", port));
      continue;
    }
    in_addr a4;
    if (inet_pton(AF_INET, host.c_str(), &a4) == 1) {
      v4.push_back(absl::StrCat(host, ":", port));
      continue;
    }
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("cannot resolve host '", host, "' of the address list '", list, "'"));
    }
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
    freeaddrinfo(res);
    v4.push_back(absl::StrCat(buf, ":", port));
  }
  if (!v4.empty() && !v6.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "address list '", list, "' mixes IPv4 and IPv6 addresses; use one family"));
  }
  if (v4.empty() && v6.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("address list '", list, "' is empty"));
  }
  return v4.empty() ? absl::StrCat("ipv6:", absl::StrJoin(v6, ","))
                    : absl::StrCat("ipv4:", absl::StrJoin(v4, ","));
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ChannelOptions& options) {
  if (address.empty() || address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("address '", address, "' must be host:port"));
  }
  // A list of addresses (several schedulers, one of them leading; etcd members): calls go only
  // to those whose grpc.health.v1 status is SERVING (a follower scheduler reports NOT_SERVING),
  // spread round-robin; one that goes away or stops serving is skipped until it is back.
  // "dns:///name:port": every address the name resolves to (a Kubernetes headless Service over
  // several schedulers), treated as such a list and resolved again as it changes.
  std::string target = address;
  std::string first_host;
  const bool dns = absl::StartsWith(address, "dns:///");
  const bool several = dns || address.find(',') != std::string::npos;
  if (dns) {
    absl::string_view rest = absl::string_view(address).substr(7);
    first_host = std::string(rest.substr(0, rest.rfind(':')));
  } else if (several) {
    auto t = MultiAddressTarget(address);
    if (!t.ok()) return t.status();
    target = *t;
    absl::string_view first = absl::StripAsciiWhitespace(address.substr(0, address.find(',')));
    first_host = std::string(first.substr(0, first.rfind(':')));
  }
  AnchorCallbackQueue();
  auto creds = MakeChannelCredentials(options.tls);
  if (!creds.ok()) return creds.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Keep pinging through a long silent call too (gRPC stops after two pings without data by
  // default), so that a server that died without closing is noticed within 15 s. Our servers
  // accept a ping every 5 s (common/grpc_server.cc).
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Reconnect quickly after a daemon restarts (the default backoff grows to minutes): the first
  // retry comes 100 ms after a refused connection, and retries are at most 2 s apart. gRPC also
  // takes the minimum backoff as the time a connection attempt may last (TCP and the HTTP/2 or
  // TLS handshake): 100 ms there made every attempt fail on a loaded machine ("connection attempt
  // timed out before receiving SETTINGS frame") and would never reach a server a few round trips
  // away over TLS, so an attempt gets 5 s.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  for (const auto& [name, value] : options.int_args) args.SetInt(name, value);
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  } else if (several && options.tls.enabled()) {
    // Certificates are checked against the first address's host (the target of a list has no
    // single host name).
    args.SetSslTargetNameOverride(first_host);
  }
  if (dns) args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 1000);
  if (several) {
    args.SetServiceConfigJSON(
        R"({"loadBalancingConfig": [{"round_robin": {}}], "healthCheckConfig": {"serviceName": ""}})");
  }
  if (options.bearer_token.empty()) return grpc::CreateCustomChannel(target, *creds, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<BearerTokenFactory>(options.bearer_token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, *creds, args,
                                                                 std::move(interceptors));
}

std::unique_ptr<grpc::ClientContext> CallContext(absl::Duration timeout, const ChannelOptions&) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  return ctx;
}

bool WaitForConnected(grpc::Channel* channel, absl::Duration timeout) {
  return channel->WaitForConnected(std::chrono::system_clock::now() +
                                   absl::ToChronoMilliseconds(timeout));
}

}  // namespace pscluster
