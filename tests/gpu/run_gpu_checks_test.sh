#!/usr/bin/env bash
# run_gpu_checks.sh's run half, on a fake bundle whose binaries are scripts that print what gtest
# and the benchmark print (no GPU needed): a run passes only when every test ran and passed and
# the benchmark ran on CUDA; a skipped test, a CPU benchmark or a missing device fail it; one
# deadline bounds the whole run; the libraries a bundle leaves out are found in $CUDA_PATH or in
# any directory of nvidia.__path__; python3 runs with the caller's environment.
set -uo pipefail

script="${TEST_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
[ -f "$script/tests/gpu/run_gpu_checks.sh" ] || script="$script/pscluster"
script="$script/tests/gpu/run_gpu_checks.sh"
[ -f "$script" ] || { echo "run_gpu_checks.sh not found"; exit 1; }
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/gpuchecks.XXXXXX")"
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

make_bundle() {  # make_bundle DIR [EXTERNAL_LIB_NAME]
  local dir=$1 b
  mkdir -p "$dir/bin" "$dir/lib"
  cp "$script" "$dir/run.sh"
  printf 'pscluster GPU check bundle\ncommit: test\nbuilt: now\n' > "$dir/MANIFEST"
  echo "${2:-}" > "$dir/lib/EXTERNAL"
  for b in device_probe_test create_backend_test ops_cuda_test model_gradient_cuda_test \
           cuda_consistency_test training_cuda_test cuda_device_test cuda_int64_index_test \
           cuda_graph_step_test cuda_step_overlap_test; do
    cat > "$dir/bin/$b" <<'EOF'
#!/usr/bin/env bash
name="$(basename "$0")"
[ "${FAKE_HANG:-}" = "$name" ] && exec sleep 1000
iters=1
for a in "$@"; do case "$a" in --gtest_repeat=*) iters="${a#--gtest_repeat=}" ;; esac; done
for ((i = 0; i < iters; i++)); do
  echo "[==========] 3 tests from 1 test suite ran. (1 ms total)"
  if [ "${FAKE_SKIP:-}" = "$name" ]; then
    echo "[  PASSED  ] 2 tests."; echo "[  SKIPPED ] 1 test, listed below:"
  else
    echo "[  PASSED  ] 3 tests."
  fi
done
EOF
  done
  cat > "$dir/bin/kernels_gpu_bench" <<'EOF'
#!/usr/bin/env bash
if [ "${1:-}" = --probe ]; then
  if [ -n "${FAKE_NODEV:-}" ]; then echo "CUDA runtime 13000, driver 12020, cuBLAS 130100; 0 device(s)"; exit 2; fi
  echo "CUDA runtime 13000, driver 13000, cuBLAS 130100; 1 device(s), device 0: Fake"; exit 0
fi
echo "device: ${FAKE_DEVICE:-cuda:0 (Fake)}"
echo "| kernel | GB/s |"
echo "STEP mlp 128 fp32 2.0000"
echo "STEP mlp 128 tf32 1.0000"
echo "STEP mlp 128 fp32+graphs 1.5000"
echo "mlp batch 128, CUDA Graphs: 1 steps plain, 1 recorded, 9 replayed"
EOF
  cat > "$dir/torch_step_bench.py" <<'EOF'
import os, sys
with open(os.environ["FAKE_TORCH_ENV"], "w") as f:
    f.write(os.environ.get("LD_LIBRARY_PATH", ""))
print("TORCH mlp 128 fp32 0.5000 1.0000")
print("torch fake", file=sys.stderr)
EOF
  chmod +x "$dir"/bin/* "$dir/run.sh"
}

# A fake compute-sanitizer and nvidia-smi first on PATH.
mkdir -p "$tmp/path"
cat > "$tmp/path/compute-sanitizer" <<'EOF'
#!/usr/bin/env bash
while [ "${1#--}" != "$1" ]; do shift 2; done
"$@"; rc=$?
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
EOF
printf '#!/bin/sh\necho "0, Fake GPU, 580.00, 1000 MiB"\n' > "$tmp/path/nvidia-smi"
chmod +x "$tmp/path"/*
export PATH="$tmp/path:$PATH"
export FAKE_TORCH_ENV="$tmp/torch_env"

run_case() {  # run_case NAME BUNDLE [VAR=VALUE...]: sets RC, OUT, ELAPSED
  local name=$1 bundle=$2; shift 2
  local t0=$SECONDS
  OUT="$(env "$@" "$bundle/run.sh" 2>&1)"
  RC=$?
  ELAPSED=$((SECONDS - t0))
  echo "---- $name: exit $RC in $ELAPSED s"
}

make_bundle "$tmp/b"

run_case "all pass" "$tmp/b" LD_LIBRARY_PATH=/callers/libs
[ "$RC" = 0 ] || fail "all pass: exit $RC"
grep -q '^RESULT: PASS' <<< "$OUT" || fail "all pass: no RESULT: PASS"
grep -q 'top-k x300 (cuda_device_test) | ok | 900 passed over 300 runs' <<< "$OUT" ||
  fail "all pass: top-k not run 300 times"
grep -q 'memcheck ops_cuda_test | ok' <<< "$OUT" || fail "all pass: memcheck not run"
grep -q '| mlp | 128 | fp32 | 2.000 ms | 0.500 ms | 1.000 ms | 2.00 |' <<< "$OUT" ||
  fail "all pass: no comparison row"
grep -q '| mlp | 128 | fp32+graphs | 1.500 ms | n/a | n/a | n/a |' <<< "$OUT" ||
  fail "all pass: no CUDA Graphs row"
grep -q 'mlp batch 128, CUDA Graphs: 1 steps plain, 1 recorded, 9 replayed' <<< "$OUT" ||
  fail "all pass: no CUDA Graphs note"
grep -q 'cuda_graph_step_test | ok' <<< "$OUT" || fail "all pass: cuda_graph_step_test not run"
grep -q 'cuda_step_overlap_test | ok' <<< "$OUT" || fail "all pass: cuda_step_overlap_test not run"
[ "$(cat "$tmp/torch_env")" = /callers/libs ] ||
  fail "python3 saw LD_LIBRARY_PATH='$(cat "$tmp/torch_env")', not the caller's"
head -5 <<< "$OUT" | grep glibc > /dev/null || fail "all pass: glibc not printed first"

run_case "a skipped test" "$tmp/b" FAKE_SKIP=cuda_int64_index_test
[ "$RC" = 1 ] || fail "skip: exit $RC, want 1"
grep -q 'cuda_int64_index_test | FAILED | .*1 skipped' <<< "$OUT" || fail "skip: not reported"
grep -q '^RESULT: FAIL' <<< "$OUT" || fail "skip: no RESULT: FAIL"

run_case "benchmark on the CPU" "$tmp/b" FAKE_DEVICE="cpu (fake)"
[ "$RC" = 1 ] || fail "cpu bench: exit $RC, want 1"
grep -q 'kernels_gpu_bench | FAILED' <<< "$OUT" || fail "cpu bench: not reported"

run_case "no device" "$tmp/b" FAKE_NODEV=1
[ "$RC" = 3 ] || fail "no device: exit $RC, want 3"
grep -q 'no usable CUDA device' <<< "$OUT" || fail "no device: no message"

run_case "a hang" "$tmp/b" FAKE_HANG=ops_cuda_test PSCLUSTER_GPU_RUN_BUDGET_S=25
[ "$RC" = 1 ] || fail "hang: exit $RC, want 1"
[ "$ELAPSED" -le 40 ] || fail "hang: the run took $ELAPSED s with a 25 s budget"
grep -q 'ops_cuda_test | FAILED | ran out of its time' <<< "$OUT" || fail "hang: not reported"
grep -q 'not started' <<< "$OUT" || fail "hang: later steps not marked as not started"

# Libraries left out of the bundle: in the second directory of the nvidia namespace package...
make_bundle "$tmp/ext" libfakeblas.so.13
mkdir -p "$tmp/site1/nvidia/cublas/lib" "$tmp/site2/nvidia/cu13/lib"
touch "$tmp/site2/nvidia/cu13/lib/libfakeblas.so.13"
run_case "wheel lookup" "$tmp/ext" PYTHONPATH="$tmp/site1:$tmp/site2" CUDA_PATH= CUDA_HOME=
[ "$RC" = 0 ] || fail "wheel lookup: exit $RC: $(grep -m1 'not found' <<< "$OUT")"
# ... or under $CUDA_PATH ...
mkdir -p "$tmp/cuda/lib64" && touch "$tmp/cuda/lib64/libfakeblas.so.13"
rm "$tmp/site2/nvidia/cu13/lib/libfakeblas.so.13"
run_case "CUDA_PATH lookup" "$tmp/ext" PYTHONPATH="$tmp/site1:$tmp/site2" CUDA_PATH="$tmp/cuda"
[ "$RC" = 0 ] || fail "CUDA_PATH lookup: exit $RC"
# ... and nowhere: the bundle is broken.
run_case "missing library" "$tmp/ext" PYTHONPATH="$tmp/site1" CUDA_PATH= CUDA_HOME=
[ "$RC" = 2 ] || fail "missing library: exit $RC, want 2"
grep -q 'libfakeblas.so.13 not found' <<< "$OUT" || fail "missing library: not named"

rm -rf "$tmp"
if [ $failures -gt 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all cases pass"
