#!/usr/bin/env bash
# Installs the Debian packages spectree needs to build and test, when they are missing.
# As root it runs apt-get; otherwise it prints the command to run.
set -euo pipefail
pkgs=(cmake make gcc clang libclang-rt-14-dev clang-format libcmocka-dev libjansson-dev python3
      python3-numpy python3-torch python3-regex)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "spectree: missing Debian packages: ${missing[*]}" >&2
    echo "          run: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi
echo "spectree: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null; }
