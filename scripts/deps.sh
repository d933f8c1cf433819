#!/usr/bin/env bash
# Installs the Debian packages spectree needs to build and test, when they are missing.
# As root it runs apt-get; otherwise it prints the command to run.
set -euo pipefail
pkgs=(cmake make gcc clang libclang-rt-14-dev clang-format libcmocka-dev libjansson-dev libmicrohttpd-dev
      nginx-light curl nodejs python3 chromium
      python3-numpy python3-torch libopenblas0-serial python3-regex python3-jsonschema)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "spectree: missing Debian packages: ${missing[*]}" >&2
        echo "          run: sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
    echo "spectree: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null; }
fi
# npm ships with Debian's nodejs or comes as its own package (Debian's npm).
if ! command -v npm >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "spectree: npm is missing; run: sudo apt-get install -y npm" >&2
        exit 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q npm >/dev/null
fi
# The official openai client and playwright-core (which drives Debian's chromium on the chat
# page) for the server's tests, pinned by tests/serve/package.json, from the npm registry; a
# failure here is fatal: the tests need them and never skip.
cd "$(dirname "$0")/../tests/serve"
stale=0
for m in openai playwright-core; do
    want=$(sed -n "s/.*\"$m\": \"\(.*\)\".*/\1/p" package.json)
    grep -qs "\"version\": \"$want\"" "node_modules/$m/package.json" || stale=1
done
if [ $stale -eq 1 ]; then
    echo "spectree: npm install (tests/serve: the openai client, playwright-core)" >&2
    npm install --no-audit --no-fund --loglevel=error >/dev/null ||
        { echo "spectree: npm install failed: the npm registry is needed for the server tests" >&2; exit 1; }
fi
