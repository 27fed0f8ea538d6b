#!/usr/bin/env bash
# Runs the codec benchmark on a few values and checks that it reports every row.
set -euo pipefail
out="$("$TEST_SRCDIR/pscluster/tests/bench/codec_bench" --elems=1003 --runs=1 --min_ms=1)"
echo "$out"
for want in "memcpy (baseline)" "fp16 encode" "fp16 decode" "bf16 encode" "bf16 decode" \
  "int8 quantize" "int8 dequantize" \
  "fp16 encode, scalar reference" "int8 dequantize, scalar reference" "top-k 1% select" \
  "int8 error-feedback step" "top-k 1% error-feedback step"; do
  grep -qF "| $want " <<<"$out" || { echo "missing: $want"; exit 1; }
done
