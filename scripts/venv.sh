#!/bin/sh
# venv.sh - create .venv with the pinned packages of tests/reference/.
# Only the reference scripts (which regenerate committed golden files) use
# it; the default test suite needs no Python packages.
set -eu
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -r tests/reference/requirements.txt
echo "venv ready: .venv/bin/python"
