#!/usr/bin/env bash
# Runs the embedding benchmark on a tiny table (20,000 keys, a cap of a quarter of them, a few
# steps) and checks that the capped server spilled, both rows of the table are there, and its
# checkpoint restored on another capped server gives the saved rows bit for bit. No
# timing is checked.
set -euo pipefail
bin="$TEST_SRCDIR/pscluster/tests/bench/embedding_bench"
mkdir -p "$TEST_TMPDIR/spill"
out="$("$bin" --keys=20000 --steps=5 --batch=1024 --spill_dir="$TEST_TMPDIR/spill" \
  --checkpoint_dir="$TEST_TMPDIR/ckpt" \
  --server_binary="$TEST_SRCDIR/pscluster/server/ps_server" 2>/dev/null)"
echo "$out"
grep -q '^| capped, disk tier |' <<<"$out" || { echo "missing the capped row"; exit 1; }
grep -q '^| uncapped, in RAM' <<<"$out" || { echo "missing the uncapped row"; exit 1; }
# The capped server has rows on disk (column 6) and spilled (column 8).
awk -F'|' '/^\| capped/ { if ($6 + 0 <= 0 || $8 + 0 <= 0) exit 1 }' <<<"$out" \
  || { echo "the capped server did not spill"; exit 1; }
# The checkpoint of both tiers was restored on another capped server, the sample bit for bit.
grep -q '^| restored by another capped server |' <<<"$out" || { echo "missing the restore row"; exit 1; }
grep -q 'bit for bit as saved' <<<"$out" || { echo "the restored rows differ"; exit 1; }
if grep -qiE '\b(nan|inf)\b' <<<"$out"; then echo "non-finite value"; exit 1; fi
