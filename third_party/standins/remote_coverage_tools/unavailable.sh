#!/bin/sh
echo "remote_coverage_tools: coverage report tools are not available in this offline build" >&2
exit 1
