#!/usr/bin/env bash
# The flag tables of README.md, server/README.md and deploy/README.md against the flags each
# binary defines (its --helpfull): none missing, none that does not exist.
set -euo pipefail
root="$TEST_SRCDIR/pscluster"
python3 "$root/tests/docs/flags_documented.py" "$root" "$root"
