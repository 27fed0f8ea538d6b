#!/usr/bin/env bash
# The generator writes the same files for the same flags, other files for another seed, and
# reports the planted model's test AUC; the planted signal's flags are checked.
set -euo pipefail
bin="$TEST_SRCDIR/pscluster/tests/data/gen_ctr_data"
for d in a b c; do mkdir -p "$TEST_TMPDIR/$d"; done
small=(--train_examples=3000 --test_examples=2000 --keys=100000)
"$bin" --out_dir="$TEST_TMPDIR/a" "${small[@]}" >/dev/null
"$bin" --out_dir="$TEST_TMPDIR/b" "${small[@]}" --gzip >/dev/null
"$bin" --out_dir="$TEST_TMPDIR/c" "${small[@]}" --seed=2 --model=linear >/dev/null
cmp "$TEST_TMPDIR/a/train.txt" <(gzip -dc "$TEST_TMPDIR/b/train.txt.gz")
cmp "$TEST_TMPDIR/a/test.txt" <(gzip -dc "$TEST_TMPDIR/b/test.txt.gz")
cmp "$TEST_TMPDIR/a/planted.txt" "$TEST_TMPDIR/b/planted.txt"
! cmp -s "$TEST_TMPDIR/a/train.txt" "$TEST_TMPDIR/c/train.txt"
[ "$(wc -l <"$TEST_TMPDIR/a/train.txt")" -eq 3000 ]
[ "$(wc -l <"$TEST_TMPDIR/a/test.txt")" -eq 2000 ]
# 40 tab-separated cells on every line.
awk -F'\t' 'NF != 40 { exit 1 }' "$TEST_TMPDIR/a/train.txt"
grep -q '^model: linear$' "$TEST_TMPDIR/c/planted.txt"
auc="$(sed -n 's/^planted_test_auc: //p' "$TEST_TMPDIR/a/planted.txt")"
awk -v a="$auc" 'BEGIN { exit !(a > 0.6 && a < 0.95) }' || { echo "planted AUC $auc"; exit 1; }
# The signal's strengths are flags, written to planted.txt; bad values are refused.
"$bin" --out_dir="$TEST_TMPDIR/c" "${small[@]}" --weight_scale=0.6 --factor_scale=0.15 >/dev/null
grep -q '^weight_scale: 0.6$' "$TEST_TMPDIR/c/planted.txt"
grep -q '^factor_scale: 0.15$' "$TEST_TMPDIR/c/planted.txt"
for bad in --weight_scale=-1 --factor_scale=-0.5 --bias=1e9; do
  if "$bin" --out_dir="$TEST_TMPDIR/c" "${small[@]}" "$bad" 2>"$TEST_TMPDIR/err"; then
    echo "$bad accepted"; exit 1
  fi
  grep -q -- "${bad%%=*}" "$TEST_TMPDIR/err" || { cat "$TEST_TMPDIR/err"; exit 1; }
done
