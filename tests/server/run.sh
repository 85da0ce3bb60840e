#!/bin/sh
# run.sh [SCRIPT] - the SDK-driven server tests: create build/venv-server
# with the pinned official clients (tests/server/requirements.txt) when
# missing, then run tests/server/SCRIPT (test_sdk.py unless named; `make
# test-server-parallel` runs test_sdk_parallel.py) against a ds4-server on a
# tiny model.
# Not part of the default suite (it needs PyPI); see docs in README.md.
set -eu
cd "$(dirname "$0")/../.."
venv=build/venv-server
if [ ! -x "$venv/bin/python" ] || ! cmp -s tests/server/requirements.txt "$venv/requirements.txt"; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q -r tests/server/requirements.txt
    cp tests/server/requirements.txt "$venv/requirements.txt"
fi
script=test_sdk.py
case "${1:-}" in test_sdk*.py) script=$1; shift ;; esac
exec "$venv/bin/python" "tests/server/$script" "$@"
