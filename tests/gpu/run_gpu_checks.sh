#!/usr/bin/env bash
# GPU checks for the compute kernels, in two halves.
#
#   tests/gpu/run_gpu_checks.sh [bundle] [--out DIR]
#       Here (any machine with the CUDA toolkit, GPU or not): builds the CUDA tests and the GPU
#       benchmark and copies them, stripped, with every non-system shared library they load
#       (ldd) into DIR (default: gpu-bundle/ in the repository, which ignores itself). cuBLAS
#       (over 500 MB) stays out: the GPU machine has it, in a CUDA toolkit or in the nvidia-*
#       Python wheels. Then it checks that every bundled binary starts from the bundle, writes
#       DIR-archive/gpu-bundle.tar.gz (what travels; it must be at most 64 MiB), unpacks that
#       archive and starts its run.sh, which must fail cleanly where there is no device.
#       On the GPU machine:
#         mkdir -p /tmp/b && tar -xzf gpu-bundle.tar.gz -C /tmp/b && /tmp/b/gpu-bundle/run.sh
#
#   DIR/run.sh            (this script, copied into the bundle)
#       On the GPU machine, under one deadline (4.5 minutes for everything, each step's time
#       limit cut to what remains): prints the libraries the binaries load, the driver and
#       glibc; runs every CUDA test (the CUDA Graph and copy-overlap step tests among them),
#       top-k 300 times, cuda_consistency_test 20 times, the int64 index tests (about 20 GB of
#       device memory)
#       and, where compute-sanitizer exists, memcheck, racecheck and synccheck; then the
#       benchmark table (cuBLAS GEMM TFLOP/s, each kernel's GB/s against a device-to-device
#       copy, MLP / CNN step times against PyTorch with and without TF32, and ours with CUDA
#       Graphs). It passes only if every test ran and passed (a skipped test fails the run) and
#       the benchmark ran on a CUDA device.
#       Exit: 0 pass, 1 a check failed or ran out of time, 2 the bundle is broken (a library
#       is missing), 3 no usable CUDA device.
set -uo pipefail

TESTS=(
  //kernels:device_probe_test
  //kernels:create_backend_test
  //kernels:ops_cuda_test
  //kernels/models:model_gradient_cuda_test
  //kernels/models:cuda_consistency_test
  //kernels/models:training_cuda_test
  //tests/gpu:cuda_device_test
  //tests/gpu:cuda_int64_index_test
  //tests/gpu:cuda_graph_step_test
  //tests/gpu:cuda_step_overlap_test
)
BENCH=//tests/gpu:kernels_gpu_bench
# Libraries every Linux machine has (or must provide itself: libcuda comes with the driver).
SYSTEM_LIBS='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libcuda)\.so'
# Left out of the bundle and looked up on the GPU machine.
EXTERNAL_LIBS='^lib(cublas|cublasLt)\.so'
MAX_ARCHIVE_MIB=64
# run.sh's deadline; with the steps' kill grace it stays under 5 minutes. The environment may
# shorten it (run_gpu_checks_test does), never lengthen it.
RUN_BUDGET_S=270
if [[ "${PSCLUSTER_GPU_RUN_BUDGET_S:-}" =~ ^[0-9]+$ ]] && [ "$PSCLUSTER_GPU_RUN_BUDGET_S" -lt $RUN_BUDGET_S ]; then
  RUN_BUDGET_S=$PSCLUSTER_GPU_RUN_BUDGET_S
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

die() { echo "run_gpu_checks: $*" >&2; exit 2; }

label_path() {  # //pkg:name -> pkg/name
  local l="${1#//}"
  echo "${l/://}"
}

# ---- Finding the libraries a bundle leaves out ----

# Directories that may hold the libraries named in the arguments, most specific first:
# $CUDA_PATH, $CUDA_HOME, the toolkit next to nvcc, /usr/local/cuda, wherever they lie under any
# directory of the nvidia-* Python wheels (all of nvidia.__path__), and what ldconfig knows.
candidate_lib_dirs() {
  local base nvcc name
  nvcc="$(command -v nvcc 2>/dev/null)" && nvcc="$(dirname "$(dirname "$(readlink -f "$nvcc")")")"
  for base in "${CUDA_PATH:-}" "${CUDA_HOME:-}" "$nvcc" /usr/local/cuda; do
    [ -n "$base" ] || continue
    echo "$base/lib64"; echo "$base/lib"; echo "$base/targets/x86_64-linux/lib"
  done
  python3 -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null |
    while read -r base; do
      for name in "$@"; do find "$base" -maxdepth 4 -name "$name" -printf '%h\n' 2>/dev/null; done
    done
  for name in "$@"; do
    ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n {print $NF}' | xargs -r -n1 dirname
  done
}

# Prints a colon-separated list of directories holding every library named in $1/lib/EXTERNAL:
# one directory with all of them when there is one (so they match), else the first hit of each.
external_lib_dirs() {
  local bundle="$1" dir name ok found dirs=() missing=0
  local -a names candidates
  mapfile -t names < <(grep -v '^$' "$bundle/lib/EXTERNAL")
  [ "${#names[@]}" -gt 0 ] || return 0
  mapfile -t candidates < <(candidate_lib_dirs "${names[@]}" | awk '!seen[$0]++')
  for dir in "${candidates[@]}"; do
    ok=1
    for name in "${names[@]}"; do [ -e "$dir/$name" ] || { ok=0; break; }; done
    if [ $ok = 1 ]; then echo "$dir"; return 0; fi
  done
  for name in "${names[@]}"; do
    found=""
    for dir in "${candidates[@]}"; do
      if [ -e "$dir/$name" ]; then found="$dir"; break; fi
    done
    if [ -n "$found" ]; then
      dirs+=("$found")
    else
      echo "run_gpu_checks: $name not found (searched: ${candidates[*]:-nothing})" >&2
      missing=1
    fi
  done
  (IFS=:; echo "${dirs[*]}")
  return $missing
}

# ---- Making the bundle (here) ----

bundle() {
  local out=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --out) out="$2"; shift 2 ;;
      --out=*) out="${1#--out=}"; shift ;;
      --slim|--archive) shift ;;  # Always so now; accepted for old command lines.
      *) die "unknown argument '$1' (see the header of $0)" ;;
    esac
  done
  local repo
  repo="$(cd "$here/../.." && pwd)"
  cd "$repo" || die "cannot enter $repo"
  out="${out:-$repo/gpu-bundle}"
  case "$out" in /*) ;; *) out="$repo/$out" ;; esac
  local archive_dir="$out-archive" archive="$out-archive/gpu-bundle.tar.gz"

  echo "== building ${TESTS[*]} $BENCH"
  bazel build "${TESTS[@]}" "$BENCH" || die "bazel build failed"
  local bin_dir
  bin_dir="$(bazel info bazel-bin 2>/dev/null)" || die "bazel info failed"
  local bins=() t
  for t in "${TESTS[@]}" "$BENCH"; do bins+=("$bin_dir/$(label_path "$t")"); done
  # (grep reads all of ldd's output: with pipefail, an early exit would fail the pipeline.)
  if ! ldd "${bins[2]}" | grep libcublas > /dev/null; then
    die "the build has no CUDA (ops_cuda_test does not load cuBLAS): install the CUDA toolkit or set PSCLUSTER_CUDA_PATH"
  fi

  echo "== bundling into $out"
  rm -rf "$out" "$archive_dir"
  mkdir -p "$out/bin" "$out/lib" || die "cannot create $out"
  echo '*' > "$out/.gitignore"  # Never committed by accident.
  local b name path
  for b in "${bins[@]}"; do
    strip --strip-debug -o "$out/bin/$(basename "$b")" "$b" || die "cannot copy $b"
  done
  cp "$here/torch_step_bench.py" "$out/" || die "cannot copy torch_step_bench.py"
  cp "$here/run_gpu_checks.sh" "$out/run.sh" || die "cannot copy run_gpu_checks.sh"
  chmod +x "$out/run.sh" "$out"/bin/*
  : > "$out/lib/EXTERNAL"
  while read -r name path; do
    [ -n "$path" ] || continue
    if [[ "$name" =~ $SYSTEM_LIBS ]]; then continue; fi
    if [[ "$name" =~ $EXTERNAL_LIBS ]]; then echo "$name" >> "$out/lib/EXTERNAL"; continue; fi
    strip --strip-unneeded -o "$out/lib/$name" "$path" 2>/dev/null ||
      cp -L "$path" "$out/lib/$name" || die "cannot copy $path"
  done < <(for b in "${bins[@]}"; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u)
  {
    echo "pscluster GPU check bundle"
    echo "commit: $(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet HEAD -- kernels tests/gpu 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), glibc $(getconf GNU_LIBC_VERSION 2>/dev/null | sed "s/glibc //")"
    echo "looked up on the GPU machine: $(tr '\n' ' ' < "$out/lib/EXTERNAL")"
  } > "$out/MANIFEST"

  echo "== checking that the bundled binaries start from the bundle"
  local extra failed=0 log rc
  extra="$(external_lib_dirs "$out")" || die "this machine lacks the libraries the bundle leaves out"
  for b in "$out"/bin/*; do
    log="$(env -i PATH=/usr/bin:/bin HOME="${HOME:-/tmp}" LD_LIBRARY_PATH="$out/lib${extra:+:$extra}" \
           timeout 60 "$b" 2>&1)"
    rc=$?
    if [ $rc -ne 0 ]; then
      echo "  $(basename "$b"): FAILED (exit $rc)"; echo "$log" | tail -5; failed=1; continue
    fi
    if grep -qE '^\[  SKIPPED \]|^SKIPPED' <<< "$log"; then
      echo "  $(basename "$b"): starts; skips (no usable device here)"
    else
      echo "  $(basename "$b"): starts; $(grep -m1 -E '^\[  PASSED  \]' <<< "$log")"
    fi
  done
  [ $failed = 0 ] || die "some bundled binaries do not start"

  echo "== archive"
  mkdir -p "$archive_dir" && echo '*' > "$archive_dir/.gitignore"
  tar -C "$(dirname "$out")" -czf "$archive" "$(basename "$out")" || die "tar failed"
  local bytes unpacked
  bytes="$(stat -c %s "$archive")"
  unpacked="$(du -sb "$out" | cut -f1)"
  echo "  $archive: $((bytes / 1048576)).$(( (bytes % 1048576) * 10 / 1048576 )) MiB" \
       "($((unpacked / 1048576)) MiB unpacked; at most $MAX_ARCHIVE_MIB MiB may travel)"
  if [ "$bytes" -gt $((MAX_ARCHIVE_MIB * 1048576)) ]; then
    echo "  largest files:"; (cd "$out" && du -ab . | sort -rn | sed -n '2,9p' | sed 's/^/    /')
    die "the archive is over $MAX_ARCHIVE_MIB MiB"
  fi

  echo "== smoke start: the archive unpacked, its run.sh"
  local smoke
  smoke="$(mktemp -d)"
  tar -xzf "$archive" -C "$smoke" || die "the archive does not unpack"
  log="$(timeout 120 "$smoke/$(basename "$out")/run.sh" 2>&1)"
  rc=$?
  rm -rf "$smoke"
  if [ $rc -eq 3 ] && grep -q 'no usable CUDA device' <<< "$log"; then
    echo "  run.sh: fails as it must without a device (exit 3): $(grep -m1 'no usable CUDA device' <<< "$log")"
  elif [ $rc -eq 0 ]; then
    echo "  run.sh: PASSED here (this machine has a device)"
  else
    echo "$log" | tail -20 | sed 's/^/    /'
    die "the unpacked bundle's run.sh failed (exit $rc) for another reason than 'no device'"
  fi
  echo "== done: carry $archive to the GPU machine (see the header of $0)"
}

# ---- Running the bundle (on the GPU machine) ----

DEADLINE=0
STEP_RC=0
RESULTS=()
FAILED=0

# Runs "$@" with a time limit of min(CAP, what remains before the deadline); a step that cannot
# get MIN seconds is not started. STEP_RC: the command's exit status, 124/137 when it ran out of
# time, 125 when it was not started.
run_step() {
  local cap=$1 min=$2 left limit; shift 2
  left=$((DEADLINE - SECONDS))
  limit=$((cap < left ? cap : left))
  if [ "$limit" -lt "$min" ]; then STEP_RC=125; return; fi
  timeout -k 5 "$limit" "$@"
  STEP_RC=$?
}

record() {  # record NAME OK(0|1) DETAIL SECONDS
  local mark=ok
  [ "$2" = 1 ] || { mark=FAILED; FAILED=1; }
  RESULTS+=("$(printf '| %s | %s | %s | %s s |' "$1" "$mark" "$3" "$4")")
}

time_note() {
  case "$1" in
    124|137) echo "ran out of its time" ;;
    125) echo "not started: the run's deadline was too near" ;;
    *) echo "exit $1" ;;
  esac
}

# gtest's own summary of a log: passes only with exit 0, `iterations` PASSED lines, no skip, no
# failure.
gtest_verdict() {  # gtest_verdict LOG RC ITERATIONS -> prints the detail, returns 0 if ok
  local log=$1 rc=$2 iters=$3 passed skipped failed
  passed="$(grep -cE '^\[  PASSED  \] [0-9]+ test' "$log")"
  skipped="$(grep -E '^\[  SKIPPED \] [0-9]+ test' "$log" | awk '{s += $4} END {print s + 0}')"
  failed="$(grep -cE '^\[  FAILED  \] [0-9]+ test' "$log")"
  local tests
  tests="$(grep -E '^\[  PASSED  \] [0-9]+ test' "$log" | awk '{s += $4} END {print s + 0}')"
  case "$rc" in
    124|125|137) time_note "$rc"; return 1 ;;
  esac
  if [ "$rc" -ne 0 ] || [ "$passed" -ne "$iters" ] || [ "$skipped" -ne 0 ] || [ "$failed" -ne 0 ] ||
     [ "$tests" -eq 0 ]; then
    echo "$(time_note "$rc"); $tests passed, $skipped skipped, $failed of $iters runs failed"
    return 1
  fi
  if [ "$iters" -gt 1 ]; then echo "$tests passed over $iters runs"; else echo "$tests passed"; fi
  return 0
}

# gtest_step NAME CAP MIN ITERATIONS BINARY ARGS...
gtest_step() {
  local name=$1 cap=$2 min=$3 iters=$4 bin=$5; shift 5
  local log t0=$SECONDS detail ok=1
  log="$WORK/$(echo "$name" | tr -c 'A-Za-z0-9_\n' '_').log"
  run_step "$cap" "$min" env LD_LIBRARY_PATH="$BUNDLE_LD" "$@" "$BUNDLE/bin/$bin" --gtest_brief=1 \
    ${GTEST_ARGS[@]+"${GTEST_ARGS[@]}"} > "$log" 2>&1
  detail="$(gtest_verdict "$log" "$STEP_RC" "$iters")" || ok=0
  # Under compute-sanitizer: errors make it exit 99 (--error-exitcode); its summary must say 0.
  if [ $ok = 1 ] && [ "$#" -gt 0 ] &&
     ! grep -qE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards displayed \(0 errors' "$log"; then
    ok=0; detail="$detail; $(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -1)"
  fi
  record "$name" $ok "$detail" $((SECONDS - t0))
  printf '  %-44s %s\n' "$name" "$([ $ok = 1 ] && echo ok || echo FAILED): $detail"
  if [ $ok = 0 ]; then
    grep -E -A12 'Failure|FAILED|Skipped|ERROR|Invalid|Race|Barrier' "$log" | head -40 | sed 's/^/      /'
  fi
}

find_sanitizer() {
  local c
  for c in "$(command -v compute-sanitizer 2>/dev/null)" "${CUDA_PATH:-/none}/bin/compute-sanitizer" \
           "${CUDA_HOME:-/none}/bin/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer \
           /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}

run() {
  BUNDLE="$here"
  DEADLINE=$((SECONDS + RUN_BUDGET_S))
  [ -d "$BUNDLE/bin" ] || die "run from a bundle (make one with: tests/gpu/run_gpu_checks.sh bundle)"
  WORK="$(mktemp -d)"
  echo "== $(sed -n 2,3p "$BUNDLE/MANIFEST" | tr '\n' ';' | sed 's/;$//; s/;/; /')"
  echo "== machine: $(uname -srm); glibc $(getconf GNU_LIBC_VERSION 2>/dev/null | sed 's/glibc //')"
  if command -v nvidia-smi > /dev/null; then
    run_step 20 5 nvidia-smi --query-gpu=index,name,driver_version,memory.total \
      --format=csv,noheader > "$WORK/smi.txt" 2>&1
    echo "== driver: $(tr '\n' ';' < "$WORK/smi.txt") $([ "$STEP_RC" = 0 ] || time_note "$STEP_RC")"
  else
    echo "== driver: nvidia-smi not found"
  fi

  # Only the bundle's binaries (and compute-sanitizer, which passes its environment on to them)
  # see the bundle's libraries; python3 and nvidia-smi keep the caller's environment (a bundle's
  # libraries in LD_LIBRARY_PATH can break torch's import).
  local extra
  extra="$(external_lib_dirs "$BUNDLE")" || die "the libraries the bundle leaves out are not on this machine"
  BUNDLE_LD="$BUNDLE/lib${extra:+:$extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "== libraries the binaries load (bundle: $BUNDLE/lib)"
  local b missing=0
  for b in "$BUNDLE"/bin/*; do
    if LD_LIBRARY_PATH="$BUNDLE_LD" ldd "$b" | grep 'not found' > /dev/null; then
      echo "  $(basename "$b"): $(LD_LIBRARY_PATH="$BUNDLE_LD" ldd "$b" | grep 'not found' | tr -s ' \t' ' ')"
      missing=1
    fi
  done
  for b in "$BUNDLE"/bin/*; do LD_LIBRARY_PATH="$BUNDLE_LD" ldd "$b"; done |
    awk '$1 ~ /^lib(cublas|cublasLt|cudart|cuda|openblas|stdc\+\+|c)\.so/ && $2 == "=>" {print "  " $1 " => " $3}' | sort -u
  [ $missing = 0 ] || die "a bundled binary lacks a library"
  run_step 30 5 env LD_LIBRARY_PATH="$BUNDLE_LD" "$BUNDLE/bin/kernels_gpu_bench" --probe \
    > "$WORK/probe.txt" 2>&1
  echo "== $(cat "$WORK/probe.txt")"
  if [ "$STEP_RC" -ne 0 ]; then
    echo "FAILED: no usable CUDA device (the checks need one; nothing was run)"
    exit 3
  fi

  echo "== CUDA tests ($((DEADLINE - SECONDS)) s left of the run's $RUN_BUDGET_S s)"
  GTEST_ARGS=()
  gtest_step device_probe_test 30 5 1 device_probe_test
  # Its other case checks the error where no device exists: it cannot run here.
  GTEST_ARGS=(--gtest_filter=-CreateBackendTest.CudaWithoutDeviceIsFailedPrecondition)
  gtest_step create_backend_test 30 5 1 create_backend_test
  echo "  (not run: CreateBackendTest.CudaWithoutDeviceIsFailedPrecondition, for machines without a device)"
  GTEST_ARGS=()
  gtest_step ops_cuda_test 60 10 1 ops_cuda_test
  gtest_step model_gradient_cuda_test 40 10 1 model_gradient_cuda_test
  gtest_step cuda_device_test 40 10 1 cuda_device_test
  gtest_step cuda_int64_index_test 60 15 1 cuda_int64_index_test
  gtest_step cuda_graph_step_test 40 10 1 cuda_graph_step_test
  gtest_step cuda_step_overlap_test 40 10 1 cuda_step_overlap_test
  if [ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    gtest_step training_cuda_test 60 15 1 training_cuda_test
  else
    GTEST_ARGS=(--gtest_filter=-*RealFashionMnist*)
    gtest_step training_cuda_test 60 15 1 training_cuda_test
    echo "  (not run: TrainingTest.MlpLearnsRealFashionMnist: dataset-fashion-mnist is not on this machine)"
  fi
  echo "== repeated"
  GTEST_ARGS=(--gtest_filter=*TopK* --gtest_repeat=300)
  gtest_step "top-k x300 (cuda_device_test)" 45 10 300 cuda_device_test
  GTEST_ARGS=(--gtest_repeat=20)
  gtest_step "cuda_consistency_test x20" 60 10 20 cuda_consistency_test

  echo "== benchmark"
  local t0=$SECONDS ok=1 detail
  run_step 60 20 env LD_LIBRARY_PATH="$BUNDLE_LD" "$BUNDLE/bin/kernels_gpu_bench" \
    > "$WORK/bench.txt" 2> "$WORK/bench.err"
  detail="$(grep -m1 '^device:' "$WORK/bench.txt")"
  if [ "$STEP_RC" -ne 0 ] || ! grep -q '^device: cuda' "$WORK/bench.txt"; then
    ok=0; detail="$(time_note "$STEP_RC"); ${detail:-no 'device: cuda' line}"; tail -5 "$WORK/bench.err"
  fi
  record kernels_gpu_bench $ok "$detail" $((SECONDS - t0))
  t0=$SECONDS
  run_step 60 20 python3 "$BUNDLE/torch_step_bench.py" > "$WORK/torch.txt" 2> "$WORK/torch.err"
  local torch_rc=$STEP_RC

  local san
  if san="$(find_sanitizer)"; then
    echo "== compute-sanitizer ($san)"
    GTEST_ARGS=()
    gtest_step "memcheck ops_cuda_test" 75 20 1 ops_cuda_test \
      "$san" --tool memcheck --error-exitcode 99 --print-limit 20
    # The kernels with shared memory, barriers and warp shuffles.
    GTEST_ARGS=(--gtest_filter=*TopK*:*ColumnSum*:*EmbeddingBag*:*Softmax*)
    gtest_step "racecheck ops_cuda_test" 50 15 1 ops_cuda_test \
      "$san" --tool racecheck --error-exitcode 99 --print-limit 20
    gtest_step "synccheck ops_cuda_test" 40 10 1 ops_cuda_test \
      "$san" --tool synccheck --error-exitcode 99 --print-limit 20
  else
    echo "== compute-sanitizer: not on this machine (memcheck, racecheck, synccheck not run)"
  fi

  echo
  grep -v '^STEP' "$WORK/bench.txt"
  echo
  if [ "$torch_rc" -ne 0 ]; then
    echo "PyTorch comparison: torch_step_bench.py failed ($(time_note "$torch_rc")):"
    tail -5 "$WORK/torch.err"
  elif grep -q '^TORCH_UNAVAILABLE' "$WORK/torch.txt"; then
    echo "PyTorch comparison: $(sed 's/^TORCH_UNAVAILABLE //' "$WORK/torch.txt")"
  else
    head -1 "$WORK/torch.err"
  fi
  echo "| model | batch | math | pscluster TrainStep (host params in, host grads out) | PyTorch compute only | PyTorch with the same transfers | pscluster / PyTorch (with transfers) |"
  echo "|---|---|---|---|---|---|---|"
  awk 'FILENAME == ARGV[1] { if ($1 == "TORCH") { k = $2 " " $3 " " $4; c[k] = $5; w[k] = $6 }; next }
       $1 == "STEP" { k = $2 " " $3 " " $4
                      if (k in w) printf "| %s | %s | %s | %.3f ms | %.3f ms | %.3f ms | %.2f |\n", $2, $3, $4, $5, c[k], w[k], $5 / w[k]
                      else printf "| %s | %s | %s | %.3f ms | n/a | n/a | n/a |\n", $2, $3, $4, $5 }' \
      "$WORK/torch.txt" "$WORK/bench.txt"
  echo
  echo "| check | result | detail | time |"
  echo "|---|---|---|---|"
  printf '%s\n' "${RESULTS[@]}"
  echo
  echo "== $((SECONDS - DEADLINE + RUN_BUDGET_S)) s; logs in $WORK"
  if [ $FAILED = 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
  return $FAILED
}

mode="${1:-}"
if [ "$mode" = run ] || { [ -z "$mode" ] && [ -d "$here/bin" ]; }; then
  run
elif [ "$mode" = bundle ]; then
  shift
  bundle "$@"
else
  bundle "$@"
fi
