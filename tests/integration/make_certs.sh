#!/usr/bin/env bash
# Makes a throw-away CA and certificates for TLS tests: ca.pem, server.{pem,key} (SAN localhost,
# 127.0.0.1), client.{pem,key}, other-ca.pem and other-client.{pem,key} (a client certificate of
# that other CA, which the first one does not trust), node.{pem,key} (SAN localhost, 127.0.0.1,
# for both server and client use: a daemon that also calls other daemons in mutual TLS).
set -euo pipefail
out="$1"
mkdir -p "$out"
cd "$out"
openssl_quiet() { openssl "$@" >/dev/null 2>&1; }
openssl_quiet req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=pscluster-test-ca" \
  -keyout ca.key -out ca.pem
openssl_quiet req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=other-ca" \
  -keyout other-ca.key -out other-ca.pem
cat > server.ext <<'EXT'
subjectAltName = DNS:localhost, IP:127.0.0.1
extendedKeyUsage = serverAuth
EXT
cat > client.ext <<'EXT'
extendedKeyUsage = clientAuth
EXT
for who in server client; do
  openssl_quiet req -newkey rsa:2048 -nodes -subj "/CN=$who" -keyout "$who.key" -out "$who.csr"
  openssl_quiet x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
    -extfile "$who.ext" -out "$who.pem"
done
openssl_quiet req -newkey rsa:2048 -nodes -subj "/CN=other-client" -keyout other-client.key \
  -out other-client.csr
openssl_quiet x509 -req -in other-client.csr -CA other-ca.pem -CAkey other-ca.key -CAcreateserial \
  -days 2 -extfile client.ext -out other-client.pem
cat > node.ext <<'EXT'
subjectAltName = DNS:localhost, IP:127.0.0.1
extendedKeyUsage = serverAuth, clientAuth
EXT
openssl_quiet req -newkey rsa:2048 -nodes -subj "/CN=node" -keyout node.key -out node.csr
openssl_quiet x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile node.ext -out node.pem
