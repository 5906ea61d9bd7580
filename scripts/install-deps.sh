#!/usr/bin/env bash
# Installs what building and testing swiftlet needs on Debian 12: compilers and libraries from
# apt, and the reference tools ("oracles") from npm into tools/oracles/node_modules.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake ninja-build pkg-config git
      nlohmann-json3-dev libsimdjson-dev libcli11-dev libfmt-dev libpcre2-dev libicu-dev liburing-dev
      libxxhash-dev libzstd-dev libcpp-httplib-dev libcurl4-openssl-dev libreadline-dev
      libgtest-dev libgmock-dev libbenchmark-dev tmux python3 python3-numpy python3-matplotlib
      chromium clang libclang-rt-14-dev nginx-light)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
# Node: Debian's nodejs + npm, unless a node with npm is already there (NodeSource's nodejs
# ships npm itself and conflicts with Debian's npm package).
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

if [ ! -d tools/oracles/node_modules ] || [ tools/oracles/package.json -nt tools/oracles/node_modules ]; then
  (cd tools/oracles && npm install --no-audit --no-fund --loglevel=error)
  touch tools/oracles/node_modules
fi
