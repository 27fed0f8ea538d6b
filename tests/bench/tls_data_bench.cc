// TLS on the TCP data plane against plaintext, in one run: two in-process servers on loopback,
// one plaintext and one in mutual TLS (server/tls_stream.h), each with one worker client over
// the TCP data port (DataTransport::kTcp). For each size a dense float32 table (SGD, so the
// transport dominates) gets push-pull rounds, plaintext and TLS interleaved round by round;
// the medians and the ratio TLS / plaintext throughput are printed.
//
//   bazel run -c opt //tests/bench:tls_data_bench -- --rounds=15 --sizes_mib=4,64
#include <openssl/evp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "server/testing/cluster.h"
#include "server/aes_gcm.h"
#include "server/tls_stream.h"

ABSL_FLAG(int, rounds, 15, "measured push-pull rounds per size and transport");
ABSL_FLAG(std::string, sizes_mib, "4,64", "table sizes in MiB, comma-separated");
ABSL_FLAG(std::string, only, "",
          "plain, tls or openssl: run only that transport's rounds (to profile one; no ratio)");
ABSL_FLAG(int, chunk_kib, 0,
          "largest message of a round in KiB (PsClientOptions::chunk_bytes; 0: the default, 4 MiB)");
ABSL_FLAG(int, spin_us, 50,
          "how long the client and the servers' data readers check an empty socket before they "
          "sleep, microseconds (PsClientOptions::spin, --data_spin_us)");
ABSL_FLAG(std::string, certs, "",
          "directory for the throw-away certificates (default: a temporary one)");

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

std::unique_ptr<PsClient> MakeClient(InProcessCluster& c, const TlsFiles& tls, size_t elems,
                                     const std::string& job) {
  PsClientOptions o;
  o.channel.tls = tls;
  o.data_transport = DataTransport::kTcp;
  o.call_timeout = absl::Seconds(120);
  o.spin = absl::Microseconds(absl::GetFlag(FLAGS_spin_us));
  if (absl::GetFlag(FLAGS_chunk_kib) > 0) {
    o.chunk_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_chunk_kib)) << 10;
  }
  auto client = c.Client(job, {DenseSpec("w", {elems}, Optimizer(v1::OptimizerSpec::SGD, 0.01f))},
                         0, o);
  if (!client.ok()) {
    std::fprintf(stderr, "client: %s\n", client.status().ToString().c_str());
    std::exit(1);
  }
  v1::ConsistencySpec asp;
  asp.set_mode(v1::ConsistencySpec::ASP);
  absl::Status st = (*client)->CreateTables(asp, 1);
  if (!st.ok()) {
    std::fprintf(stderr, "tables: %s\n", st.ToString().c_str());
    std::exit(1);
  }
  return std::move(*client);
}

// CPU time of this process (the servers' and the clients' threads), in seconds.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// One push-pull round: its wall time; adds the CPU time it took to `*cpu`.
double Round(PsClient* client, std::vector<float>& g, std::vector<float>& v, double* cpu) {
  const double cpu_start = CpuSeconds();
  const absl::Time start = absl::Now();
  absl::Status st = client->PushPull(0, {{{"w", g.data()}}, {}}, {{{"w", v.data()}}, {}});
  if (!st.ok()) {
    std::fprintf(stderr, "push-pull: %s\n", st.ToString().c_str());
    std::exit(1);
  }
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  *cpu += CpuSeconds() - cpu_start;
  return wall;
}

// GB/s of sealing 16 KiB records (AES-128-GCM, the TLS header as additional data) on one core
// for about `seconds`: with the vector instructions on registers of `bits` (256 or 512), or with
// OpenSSL's EVP (bits 0).
double SealRate(int bits, double seconds) {
  const bool vector = bits != 0;
  std::vector<unsigned char> in(16384, 7), out(16384 + 16), key(16, 1), nonce(12, 2), aad(5, 3);
  VectorAesGcm gcm(vector ? bits : 256);
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  if (vector) {
    gcm.SetKey(key.data(), key.size());
  } else {
    EVP_EncryptInit_ex(ctx, EVP_aes_128_gcm(), nullptr, key.data(), nullptr);
  }
  size_t records = 0;
  const absl::Time start = absl::Now();
  absl::Duration took;
  while ((took = absl::Now() - start) < absl::Seconds(seconds)) {
    for (int i = 0; i < 64; ++i, ++records) {
      nonce[0] = static_cast<unsigned char>(records);
      if (vector) {
        gcm.Crypt(nonce.data(), 0, in.data(), out.data(), in.size());
        gcm.Tag(nonce.data(), aad.data(), aad.size(), out.data(), in.size(), out.data() + in.size());
      } else {
        int len = 0;
        EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce.data());
        EVP_EncryptUpdate(ctx, nullptr, &len, aad.data(), static_cast<int>(aad.size()));
        EVP_EncryptUpdate(ctx, out.data(), &len, in.data(), static_cast<int>(in.size()));
        EVP_EncryptFinal_ex(ctx, out.data() + len, &len);
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, out.data() + in.size());
      }
    }
  }
  EVP_CIPHER_CTX_free(ctx);
  return static_cast<double>(records * in.size()) / absl::ToDoubleSeconds(took) / 1e9;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::string dir = absl::GetFlag(FLAGS_certs);
  if (dir.empty()) {
    char tmpl[] = "/tmp/tls_data_bench.XXXXXX";
    dir = mkdtemp(tmpl);
  }
  const char* src = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  const std::string script =
      std::string(src != nullptr ? src : ".") + "/tests/integration/make_certs.sh";
  if (std::system((script + " " + dir).c_str()) != 0) {
    std::fprintf(stderr, "%s failed (openssl installed?)\n", script.c_str());
    return 1;
  }
  PsServerOptions tls_options;
  tls_options.tls = {dir + "/server.pem", dir + "/server.key", dir + "/ca.pem"};
  tls_options.data_unix = false;
  tls_options.data_spin = absl::Microseconds(absl::GetFlag(FLAGS_spin_us));
  PsServerOptions plain_options;
  plain_options.data_unix = false;
  plain_options.data_spin = tls_options.data_spin;
  InProcessCluster plain(1, plain_options);
  InProcessCluster tls(1, tls_options);
  if (!plain.status().ok() || !tls.status().ok()) {
    std::fprintf(stderr, "servers: %s %s\n", plain.status().ToString().c_str(),
                 tls.status().ToString().c_str());
    return 1;
  }
  const TlsFiles client_tls{dir + "/client.pem", dir + "/client.key", dir + "/ca.pem"};
  std::printf("TLS records: %s; \"openssl\" = the same TLS with OpenSSL's EVP sealing and "
              "opening every record (--tls_vector_aes=false)\n",
              TlsIo::UsesVectorAes() ? "AES-GCM on the CPU's VAES/VPCLMULQDQ (server/aes_gcm.h)"
                                     : "OpenSSL (this CPU lacks VAES/VPCLMULQDQ/AVX-512)");
  std::printf("sealing 16 KiB records, AES-128-GCM, one core: %.2f GB/s with OpenSSL's EVP",
              SealRate(0, 0.5));
  for (int bits : {256, 512}) {
    if (VectorAesGcm::Supports(bits)) {
      std::printf(", %.2f GB/s with VAES/VPCLMULQDQ on %d-bit registers", SealRate(bits, 0.5),
                  bits);
    }
  }
  std::printf(" (the records use the widest)\n");
  std::printf("%-8s %9s %9s %11s %11s %9s %7s %12s %11s %10s %12s\n", "size", "plain ms",
              "tls ms", "openssl ms", "plain GB/s", "tls GB/s", "ratio", "openssl ratio",
              "plain cores", "tls cores", "openssl cores");
  int job = 0;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes_mib), ',')) {
    int mib = 0;
    if (!absl::SimpleAtoi(s, &mib) || mib <= 0) {
      std::fprintf(stderr, "--sizes_mib: bad size '%s'\n", std::string(s).c_str());
      return 1;
    }
    const size_t elems = static_cast<size_t>(mib) << 18;  // float32
    const std::string name = "bench" + std::to_string(job++);
    auto a = MakeClient(plain, {}, elems, name);
    auto b = MakeClient(tls, client_tls, elems, name);
    auto o = MakeClient(tls, client_tls, elems, name + "o");
    std::vector<float> g(elems, 0.001f), v(elems);
    double cpu_plain = 0, cpu_tls = 0, cpu_openssl = 0, warm = 0;
    for (int w = 0; w < 2; ++w) {  // Warm-up: connections, buffers.
      Round(a.get(), g, v, &warm);
      Round(b.get(), g, v, &warm);
    }
    // o's connection (both ends) is set up with OpenSSL's records: a round needs both handshakes
    // done, and the choice holds for a connection's life.
    TlsIo::SetVectorAes(false);
    for (int w = 0; w < 2; ++w) Round(o.get(), g, v, &warm);
    TlsIo::SetVectorAes(true);
    std::vector<double> tp, tt, to;
    const std::string only = absl::GetFlag(FLAGS_only);
    for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
      tp.push_back(only.empty() || only == "plain" ? Round(a.get(), g, v, &cpu_plain) : 1.0);
      tt.push_back(only.empty() || only == "tls" ? Round(b.get(), g, v, &cpu_tls) : 1.0);
      to.push_back(only.empty() || only == "openssl" ? Round(o.get(), g, v, &cpu_openssl) : 1.0);
    }
    const double mp = Median(tp), mt = Median(tt), mo = Median(to);
    double sum_p = 0, sum_t = 0, sum_o = 0;
    for (double t : tp) sum_p += t;
    for (double t : tt) sum_t += t;
    for (double t : to) sum_o += t;
    const double bytes = 2.0 * elems * sizeof(float);  // Pushed and pulled.
    // Cores busy: CPU time over wall time of all rounds of a transport.
    std::printf("%-8s %9.2f %9.2f %11.2f %11.2f %9.2f %7.2f %12.2f %11.2f %10.2f %12.2f\n",
                (std::to_string(mib) + "MiB").c_str(), mp * 1e3, mt * 1e3, mo * 1e3,
                bytes / mp / 1e9, bytes / mt / 1e9, mp / mt, mp / mo, cpu_plain / sum_p,
                cpu_tls / sum_t, cpu_openssl / sum_o);
    std::fflush(stdout);
  }
  std::printf("ratio = TLS throughput / plaintext throughput (medians of %d interleaved rounds; "
              "openssl ratio: the same with OpenSSL's records); "
              "cores = CPU time of the process / wall time over those rounds\n",
              absl::GetFlag(FLAGS_rounds));
  return 0;
}

}  // namespace
}  // namespace pscluster

int main(int argc, char** argv) { return pscluster::Main(argc, argv); }
