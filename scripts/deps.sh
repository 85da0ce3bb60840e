#!/bin/sh
# deps.sh - install the Debian packages ds4 needs, when missing.
# Runs apt-get (through sudo when not root) only if something is absent, so
# it is cheap to call from every make target that needs the toolchain.
set -eu

PKGS="build-essential pkg-config xz-utils python3 python3-venv
libpcre2-dev libjansson-dev libmicrohttpd-dev libedit-dev libssl-dev libcurl4-openssl-dev libcmocka-dev
clang libclang-rt-dev tmux
libopenmpi-dev openmpi-bin"

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

echo "deps: installing:$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
