// A plain HTTP/1.0 GET for tests of the daemons' /metrics and status endpoints.
#ifndef PSCLUSTER_COMMON_TESTING_HTTP_GET_H_
#define PSCLUSTER_COMMON_TESTING_HTTP_GET_H_

#include <string>

namespace pscluster::testing {

// The whole response (status line, headers, body) of GET `path` from 127.0.0.1:`port`, with
// `bearer_token` in an Authorization header when given; "" on any error.
std::string HttpGet(int port, const std::string& path, const std::string& bearer_token = "");

}  // namespace pscluster::testing

#endif  // PSCLUSTER_COMMON_TESTING_HTTP_GET_H_
