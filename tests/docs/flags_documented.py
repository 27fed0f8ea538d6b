#!/usr/bin/env python3
"""Every flag a binary defines (its own main.cc, as --helpfull lists it) is documented, and every
flag the docs document exists. Usage: flags_documented.py ROOT BIN_DIR."""
import re
import subprocess
import sys

root, bins = sys.argv[1], sys.argv[2]


def flags_of(binary, source):
    out = subprocess.run([f"{bins}/{binary}", "--helpfull"], capture_output=True, text=True)
    text = out.stdout + out.stderr
    flags, own = set(), False
    for line in text.splitlines():
        if line.strip().startswith("Flags from"):
            own = line.strip().rstrip(":").endswith(source)
        elif own:
            m = re.match(r"\s+--([a-z0-9_]+) \(", line)
            if m:
                flags.add(m.group(1))
    if not flags:
        sys.exit(f"{binary} --helpfull listed no flags of {source}:\n{text[:2000]}")
    return flags


def section(path, start, end=None):
    text = open(f"{root}/{path}").read()
    i = text.index(start)
    j = text.index(end, i + len(start)) if end else len(text)
    return text[i:j]


def table_flags(text):
    """Flags in the first column of markdown tables."""
    flags = set()
    for line in text.splitlines():
        if line.startswith("| `--"):
            first = line.split("|")[1]
            flags.update(re.findall(r"`--([a-z0-9_]+)[=`]", first))
    return flags


def mentioned(text):
    short = {"o"} if re.search(r"(?<![-\w])-o\b", text) else set()
    return set(re.findall(r"--([a-z0-9_]+)", text)) | short


readme = open(f"{root}/README.md").read()
common = mentioned(section("README.md", "Common to every daemon:", "`ps_server`"))
checks = [
    ("ps_server", "server/main.cc", [
        ("README.md ps_server table", table_flags(section("README.md", "`ps_server`\n", "`ps_worker`\n")) | common),
        ("server/README.md flag table", table_flags(section("server/README.md", "## Running", "\n## "))),
    ]),
    ("ps_worker", "worker/main.cc", [
        ("README.md ps_worker table", table_flags(section("README.md", "`ps_worker`\n", "## Layout")) | common),
    ]),
    ("ps_scheduler", "scheduler/scheduler_main.cc", [
        ("deploy/README.md ps_scheduler table", table_flags(section("deploy/README.md", "## ps_scheduler", "\n## "))),
    ]),
    ("psctl", "scheduler/psctl/psctl_main.cc", [
        ("deploy/README.md psctl section and launcher table",
         table_flags(section("deploy/README.md", "## The one-command local cluster", "## Job files")) |
         mentioned(section("deploy/README.md", "## psctl", "## ps_scheduler"))),
    ]),
]
binaries = {"ps_server": "server/ps_server", "ps_worker": "worker/ps_worker",
            "ps_scheduler": "scheduler/ps_scheduler", "psctl": "scheduler/psctl"}
failed = False
for name, source, docs in checks:
    actual = flags_of(binaries[name], source)
    for where, documented in docs:
        missing = sorted(actual - documented)
        extra = sorted(documented - actual)
        if missing:
            print(f"{where}: {name} flags not documented: {', '.join('--' + f for f in missing)}")
            failed = True
        if extra:
            print(f"{where}: documented flags {name} does not have: {', '.join('--' + f for f in extra)}")
            failed = True
sys.exit(1 if failed else 0)
