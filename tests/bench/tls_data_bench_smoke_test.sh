#!/usr/bin/env bash
# Runs the TLS data-plane benchmark on a tiny configuration (1 MiB, three rounds) and checks that
# it reports the sealing rates and the row of plaintext, TLS and OpenSSL's records, with finite
# numbers. No timing is checked.
set -euo pipefail
cd "$TEST_SRCDIR/pscluster"  # The benchmark finds tests/integration/make_certs.sh from here.
mkdir -p "$TEST_TMPDIR/certs"
out="$(env -u BUILD_WORKSPACE_DIRECTORY tests/bench/tls_data_bench --sizes_mib=1 --rounds=3 \
  --certs="$TEST_TMPDIR/certs" 2>&1)"
echo "$out"
for want in "TLS records: " "sealing 16 KiB records, AES-128-GCM, one core: " "with OpenSSL's EVP" \
  "openssl ratio"; do
  grep -q "$want" <<<"$out" || { echo "missing: $want"; exit 1; }
done
row="$(grep '^1MiB ' <<<"$out")" || { echo "missing the 1 MiB row"; exit 1; }
[ "$(wc -w <<<"$row")" -eq 11 ] || { echo "the 1 MiB row has not 11 columns: $row"; exit 1; }
if grep -qiE '\b(nan|inf)\b' <<<"$row"; then echo "non-finite value: $row"; exit 1; fi
