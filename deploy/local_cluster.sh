#!/usr/bin/env bash
# The one-command local cluster as a Bazel run target:
#
#   bazel run //deploy:local_cluster            # scheduler, 2 servers, 2 workers; trains
#                                               # deploy/examples/fashion_mlp.yaml to the end
#   bazel run //deploy:local_cluster -- --job=$PWD/deploy/examples/spam_sparse.yaml
#
# It runs `psctl up --local` with the binaries from this target's runfiles; ps_server and
# ps_worker are taken from the runfiles when present, else from the workspace's bazel-bin.
set -euo pipefail
runfiles="${RUNFILES_DIR:-$0.runfiles}/pscluster"
extra=()
if [ -x "$runfiles/server/ps_server" ]; then extra+=("--server_bin=$runfiles/server/ps_server"); fi
if [ -x "$runfiles/worker/ps_worker" ]; then extra+=("--worker_bin=$runfiles/worker/ps_worker"); fi
exec "$runfiles/scheduler/psctl" up --local \
  --scheduler_bin="$runfiles/scheduler/ps_scheduler" \
  --job="$runfiles/deploy/examples/fashion_mlp.yaml" \
  "${extra[@]}" "$@"
