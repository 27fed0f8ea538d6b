// A plain HTTP/1.0 GET for tests of the daemons' /metrics and status endpoints.
#ifndef PSCLUSTER_COMMON_TESTING_HTTP_GET_H_
#define PSCLUSTER_COMMON_TESTING_HTTP_GET_H_

#include <string>

namespace pscluster::testing {

// The whole response (status line, headers, body) of GET `path` from 127.0.0.1:`port`; "" on any
// error.
std::string HttpGet(int port, const std::string& path);

}  // namespace pscluster::testing

#endif  // PSCLUSTER_COMMON_TESTING_HTTP_GET_H_
