// Certificates for tests, made with openssl by make_certs.sh (a CA; a server certificate for
// 127.0.0.1 and localhost; a client certificate; see the script for the file names).
#ifndef PSCLUSTER_TESTS_INTEGRATION_TEST_CERTS_H_
#define PSCLUSTER_TESTS_INTEGRATION_TEST_CERTS_H_

#include <string>

namespace pscluster::testing {

// Makes them in $TEST_TMPDIR/certs and returns that directory; on failure adds a test failure
// naming the command and returns "". (The test needs make_certs.sh in its data.)
std::string MakeTestCerts();

}  // namespace pscluster::testing

#endif  // PSCLUSTER_TESTS_INTEGRATION_TEST_CERTS_H_
