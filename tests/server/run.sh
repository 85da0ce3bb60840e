#!/bin/sh
# run.sh - the SDK-driven server tests: create build/venv-server with the
# pinned official clients (tests/server/requirements.txt) when missing, then
# run tests/server/test_sdk.py against a ds4-server on a tiny model.
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
exec "$venv/bin/python" tests/server/test_sdk.py "$@"
