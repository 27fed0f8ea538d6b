#!/usr/bin/env bash
# The systemd units as shipped, checked by systemd itself: `systemd-analyze verify` on each unit
# with ExecStart pointing at the binaries this build made (the units name /usr/local/bin, where
# the README installs them), failing on any complaint (unknown keys, bad values, missing
# executables); and the sysusers file applied by `systemd-sysusers` to an empty root, which must
# create the pscluster user and group with the state directory as home.
set -euo pipefail

if ! command -v systemd-analyze >/dev/null || ! command -v systemd-sysusers >/dev/null; then
  echo "systemd-analyze / systemd-sysusers not installed (Debian package systemd): cannot verify" >&2
  exit 1
fi

runfiles="${TEST_SRCDIR:-$0.runfiles}/pscluster"
tmp="${TEST_TMPDIR:-$(mktemp -d)}/systemd"
rm -rf "$tmp" && mkdir -p "$tmp/units" "$tmp/root/etc"

for unit in ps-scheduler ps-server ps-worker; do
  bin="${unit/ps-/ps_}"
  case "$bin" in
    ps_scheduler) exe="$runfiles/scheduler/ps_scheduler" ;;
    ps_server) exe="$runfiles/server/ps_server" ;;
    ps_worker) exe="$runfiles/worker/ps_worker" ;;
  esac
  [ -x "$exe" ] || { echo "missing $exe" >&2; exit 1; }
  src="$runfiles/deploy/systemd/$unit.service"
  grep -q "ExecStart=/usr/local/bin/$bin " "$src" || { echo "$unit: ExecStart is not /usr/local/bin/$bin" >&2; exit 1; }
  sed "s#/usr/local/bin/$bin#$exe#" "$src" > "$tmp/units/$unit.service"
  out="$(systemd-analyze verify "$tmp/units/$unit.service" 2>&1)" || {
    echo "$unit: systemd-analyze verify failed:" >&2; echo "$out" >&2; exit 1; }
  # Warnings print but do not fail verify; any line about this unit is a defect.
  if echo "$out" | grep -q "$unit"; then
    echo "$unit: systemd-analyze verify complained:" >&2; echo "$out" >&2; exit 1
  fi
  for key in User=pscluster StateDirectory=pscluster; do
    grep -q "^$key" "$src" || { echo "$unit: no $key" >&2; exit 1; }
  done
  echo "$unit: verified"
done

# The worker writes exports, the server checkpoints and exports: each has the directories.
grep -q "^StateDirectory=.*pscluster/exports" "$runfiles/deploy/systemd/ps-worker.service"
grep -q "^StateDirectory=.*pscluster/checkpoints" "$runfiles/deploy/systemd/ps-server.service"

systemd-sysusers --root="$tmp/root" "$runfiles/deploy/systemd/pscluster.sysusers"
grep -q '^pscluster:x:[0-9]*:[0-9]*:pscluster daemons:/var/lib/pscluster:/usr/sbin/nologin$' \
  "$tmp/root/etc/passwd" || { echo "sysusers: no pscluster user in:" >&2; cat "$tmp/root/etc/passwd" >&2; exit 1; }
grep -q '^pscluster:x:' "$tmp/root/etc/group"
echo "sysusers: pscluster user and group created"
