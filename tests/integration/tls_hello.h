// The first bytes a TLS client sends (its ClientHello), for tests that feed a server's TLS data
// port partial or corrupted handshakes.
#ifndef PSCLUSTER_TESTS_INTEGRATION_TLS_HELLO_H_
#define PSCLUSTER_TESTS_INTEGRATION_TLS_HELLO_H_

#include <string>

namespace pscluster::testing {

std::string TlsClientHello();

}  // namespace pscluster::testing

#endif  // PSCLUSTER_TESTS_INTEGRATION_TLS_HELLO_H_
