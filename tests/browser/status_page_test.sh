#!/usr/bin/env bash
# Runs status_page_test.py with a Python that has Selenium (Debian's python3-selenium lives in
# /usr/bin/python3's packages; Bazel 4's py_test would need a Python toolchain download).
set -euo pipefail
py=python3
for p in /usr/bin/python3 python3; do
  if "$p" -c "import selenium" 2>/dev/null; then py="$p"; break; fi
done
exec "$py" "${TEST_SRCDIR}/pscluster/tests/browser/status_page_test.py" "${TEST_SRCDIR}/pscluster"
