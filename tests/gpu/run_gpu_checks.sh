#!/usr/bin/env bash
# GPU checks for the compute kernels, in two halves:
#
#   tests/gpu/run_gpu_checks.sh [bundle] [--out DIR] [--slim] [--archive]
#       Here (any machine with the CUDA toolkit, GPU or not): builds the CUDA tests and the GPU
#       benchmark, copies them with every non-system shared library they load (ldd) into DIR
#       (default: gpu-bundle/ in the repository, which ignores itself), and checks that each
#       bundled binary starts from the bundle and skips cleanly when no device is present.
#       --slim leaves out the CUDA toolkit's libraries (cuBLAS is ~600 MB); the bundle then finds
#       them on the GPU machine (/usr/local/cuda, $CUDA_HOME, or the nvidia-* Python wheels).
#       --archive also writes DIR-archive/gpu-bundle.tar.gz (the folder ignores itself too); on
#       the GPU machine: tar -xzf gpu-bundle.tar.gz -C /tmp && /tmp/gpu-bundle/run.sh
#
#   DIR/run.sh            (the same script, copied into the bundle)
#       On the GPU machine: runs the CUDA tests, then prints the table: cuBLAS GEMM TFLOP/s,
#       each hand-written kernel's GB/s against a device-to-device copy measured in the same
#       run, and MLP / CNN training-step times against PyTorch on the same device. Exits non-zero
#       if a test fails. Takes about a minute; every part has a time limit (5 minutes in all).
set -uo pipefail

TESTS=(
  //kernels:device_probe_test
  //kernels:create_backend_test
  //kernels:ops_cuda_test
  //kernels/models:model_gradient_cuda_test
  //kernels/models:cuda_consistency_test
  //kernels/models:training_cuda_test
)
BENCH=//tests/gpu:kernels_gpu_bench
# Libraries every Linux machine has (or must provide itself: libcuda comes with the driver).
SYSTEM_LIBS='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libcuda)\.so'
CUDA_TOOLKIT_LIBS='^lib(cublas|cublasLt|cudart)\.so'

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

die() { echo "run_gpu_checks: $*" >&2; exit 1; }

label_path() {  # //pkg:name -> pkg/name
  local l="${1#//}"
  echo "${l/://}"
}

bundle() {
  local out="" slim=0 archive=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --out) out="$2"; shift 2 ;;
      --out=*) out="${1#--out=}"; shift ;;
      --slim) slim=1; shift ;;
      --archive) archive=1; shift ;;
      *) die "unknown argument '$1' (see the header of $0)" ;;
    esac
  done
  local repo
  repo="$(cd "$here/../.." && pwd)"
  cd "$repo" || die "cannot enter $repo"
  out="${out:-$repo/gpu-bundle}"
  case "$out" in /*) ;; *) out="$repo/$out" ;; esac

  echo "== building ${TESTS[*]} $BENCH"
  bazel build "${TESTS[@]}" "$BENCH" || die "bazel build failed"
  local bin_dir
  bin_dir="$(bazel info bazel-bin 2>/dev/null)" || die "bazel info failed"
  local bins=()
  for t in "${TESTS[@]}" "$BENCH"; do bins+=("$bin_dir/$(label_path "$t")"); done
  if ! ldd "${bins[2]}" | grep -q libcublas; then
    die "the build has no CUDA (ops_cuda_test does not load cuBLAS): install the CUDA toolkit or set PSCLUSTER_CUDA_PATH"
  fi

  echo "== bundling into $out"
  rm -rf "$out"
  mkdir -p "$out/bin" "$out/lib" || die "cannot create $out"
  echo '*' > "$out/.gitignore"  # Never committed by accident.
  for b in "${bins[@]}"; do cp "$b" "$out/bin/" || die "cannot copy $b"; done
  cp "$here/torch_step_bench.py" "$out/" && cp "$here/run_gpu_checks.sh" "$out/run.sh"
  chmod +x "$out/run.sh"
  : > "$out/lib/EXTERNAL"
  local lib name path
  while read -r name path; do
    [ -n "$path" ] || continue
    if [[ "$name" =~ $SYSTEM_LIBS ]]; then continue; fi
    if [ "$slim" = 1 ] && [[ "$name" =~ $CUDA_TOOLKIT_LIBS ]]; then
      echo "$name" >> "$out/lib/EXTERNAL"
      continue
    fi
    cp -L "$path" "$out/lib/$name" || die "cannot copy $path"
  done < <(for b in "${bins[@]}"; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u)
  {
    echo "pscluster GPU check bundle"
    echo "commit: $(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    echo "slim: $slim"
  } > "$out/MANIFEST"

  echo "== checking that the bundled binaries start from the bundle"
  local failed=0 log
  for b in "$out"/bin/*; do
    log="$(env -i PATH=/usr/bin:/bin HOME="${HOME:-/tmp}" LD_LIBRARY_PATH="$out/lib" "$b" 2>&1)"
    local rc=$?
    if [ "$slim" = 1 ] && echo "$log" | grep -q "cannot open shared object"; then
      echo "  $(basename "$b"): needs the CUDA libraries it will find on the GPU machine (slim)"
      continue
    fi
    if [ $rc -ne 0 ]; then
      echo "  $(basename "$b"): FAILED (exit $rc)"; echo "$log" | tail -5; failed=1; continue
    fi
    if echo "$log" | grep -qE '^\[  SKIPPED \]|^SKIPPED'; then
      echo "  $(basename "$b"): starts; skips (no usable device here)"
    else
      echo "  $(basename "$b"): starts; $(echo "$log" | grep -E '^\[  PASSED  \]' | head -1)"
    fi
  done
  [ $failed = 0 ] || die "some bundled binaries do not start"
  du -sh "$out" | awk '{print "== bundle size: " $1}'
  if [ "$archive" = 1 ]; then
    mkdir -p "$out-archive" && echo '*' > "$out-archive/.gitignore"
    tar -C "$(dirname "$out")" -czf "$out-archive/gpu-bundle.tar.gz" "$(basename "$out")" ||
      die "tar failed"
    du -sh "$out-archive/gpu-bundle.tar.gz" | awk '{print "== archive: " $2 " (" $1 ")"}'
  fi
  echo "== done: on the GPU machine run $out/run.sh"
}

# Finds, for a slim bundle, each CUDA library it left out; prints the directories to search.
external_lib_dirs() {
  local bundle="$1" dirs=() cand
  local candidates=("${CUDA_HOME:-/nonexistent}/lib64" /usr/local/cuda/lib64
                    /usr/local/cuda/targets/x86_64-linux/lib)
  local py_dir
  py_dir="$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]) + "/nvidia")' 2>/dev/null)"
  while read -r name; do
    [ -n "$name" ] || continue
    local found=""
    for cand in "${candidates[@]}"; do
      if [ -e "$cand/$name" ]; then found="$cand"; break; fi
    done
    if [ -z "$found" ] && [ -n "$py_dir" ]; then
      found="$(find "$py_dir" -maxdepth 3 -name "$name" -printf '%h\n' 2>/dev/null | head -1)"
    fi
    if [ -n "$found" ]; then dirs+=("$found"); else echo "run_gpu_checks: $name not found on this machine" >&2; fi
  done < "$bundle/lib/EXTERNAL"
  (IFS=:; echo "${dirs[*]}")
}

run() {
  local bundle="$here" start=$SECONDS
  [ -d "$bundle/bin" ] || die "run from a bundle (make one with: tests/gpu/run_gpu_checks.sh bundle)"
  local extra
  extra="$(external_lib_dirs "$bundle")"
  export LD_LIBRARY_PATH="$bundle/lib${extra:+:$extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local work
  work="$(mktemp -d)"
  echo "== $(head -2 "$bundle/MANIFEST" | tail -1)"
  command -v nvidia-smi > /dev/null && nvidia-smi -L

  echo "== CUDA tests"
  local failed=0 t rc summary
  for t in "$bundle"/bin/*_test; do
    timeout 150 "$t" --gtest_brief=1 > "$work/$(basename "$t").log" 2>&1
    rc=$?
    summary="$(grep -E '^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]' "$work/$(basename "$t").log" |
               sed 's/\[ *//; s/ *\]//' | tr '\n' ' ')"
    printf '  %-28s exit %-3s %s\n' "$(basename "$t")" "$rc" "$summary"
    if [ $rc -ne 0 ]; then failed=1; grep -A15 'Failure\|FAILED\|Timeout' "$work/$(basename "$t").log" | head -40; fi
  done

  echo "== benchmarks"
  timeout 200 "$bundle/bin/kernels_gpu_bench" > "$work/bench.txt" 2> "$work/bench.err"
  rc=$?
  [ $rc -eq 0 ] || { echo "kernels_gpu_bench failed (exit $rc):"; tail -5 "$work/bench.err"; failed=1; }
  timeout 150 python3 "$bundle/torch_step_bench.py" > "$work/torch.txt" 2> "$work/torch.err"
  [ $? -eq 0 ] || { echo "torch_step_bench.py failed:"; tail -5 "$work/torch.err"; }

  echo
  grep -v '^STEP' "$work/bench.txt"
  echo
  if grep -q '^TORCH_UNAVAILABLE' "$work/torch.txt"; then
    echo "PyTorch comparison: $(sed 's/^TORCH_UNAVAILABLE //' "$work/torch.txt")"
  fi
  echo "| model | batch | pscluster TrainStep (host params in, host grads out) | PyTorch compute only | PyTorch with the same transfers | pscluster / PyTorch (with transfers) |"
  echo "|---|---|---|---|---|---|"
  awk 'FILENAME == ARGV[1] { if ($1 == "TORCH") { c[$2 " " $3] = $4; w[$2 " " $3] = $5 }; next }
       $1 == "STEP" { k = $2 " " $3
                      if (k in w) printf "| %s | %s | %.3f ms | %.3f ms | %.3f ms | %.2f |\n", $2, $3, $4, c[k], w[k], $4 / w[k]
                      else printf "| %s | %s | %.3f ms | n/a | n/a | n/a |\n", $2, $3, $4 }' \
      "$work/torch.txt" "$work/bench.txt"
  echo
  echo "== $((SECONDS - start)) s; logs in $work"
  return $failed
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
