#include "tests/integration/tls_hello.h"

#include <gtest/gtest.h>
#include <openssl/bio.h>
#include <openssl/ssl.h>

#include "server/tls_stream.h"

namespace pscluster::testing {

std::string TlsClientHello() {
  auto ctx = TlsContext::ForClient({"", "", ""}, "localhost");
  EXPECT_TRUE(ctx.ok());
  if (!ctx.ok()) return "";
  SSL* ssl = SSL_new((*ctx)->ctx());
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  SSL_set_bio(ssl, in, out);
  SSL_set_connect_state(ssl);
  SSL_do_handshake(ssl);
  char* data = nullptr;
  const long n = BIO_get_mem_data(out, &data);
  std::string hello(data, static_cast<size_t>(n));
  SSL_free(ssl);
  return hello;
}

}  // namespace pscluster::testing
