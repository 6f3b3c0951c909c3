#!/usr/bin/env bash
# Installs the Debian packages k3 builds and tests with (DESIGN.md §3).
# Idempotent: installs only what is missing, and says what it installed.
# Works as root, or through sudo otherwise. Fetches nothing from anywhere but Debian.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libcli11-dev libxxhash-dev libssl-dev libcurl4-openssl-dev liburing-dev
  nlohmann-json3-dev libpcre2-dev libcpp-httplib-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
  python3-torch python3-numpy python3-xxhash python3-jsonschema
  openmpi-bin libopenmpi-dev
  libjpeg-dev libpng-dev python3-pil
  chromium
)
# nodejs/npm (tokenizer parity test, the openai client test of the server): a machine may already carry a nodejs build that bundles
# npm; Debian's npm package conflicts with it, so ask for them only when absent.
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

# The npm test oracles, run at the end whatever apt did: tiktoken for the tokenizer parity test
# and benchmark, and the official openai client for the server's client test. Each directory
# pins its package in package.json; without npm or the registry, those tests are SKIPPED.
# usage: install_npm_oracle DIR FILE-THAT-SHOWS-IT-IS-INSTALLED PACKAGE WHAT-SKIPS
install_npm_oracle() {
  local dir="$1" marker="$2" package="$3" what="$4"
  if [ -f "$dir/node_modules/$marker" ]; then
    echo "setup: npm $package already installed in $dir/node_modules"
    return 0
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "setup: WARNING: npm not found; $what will be SKIPPED" >&2
    return 0
  fi
  echo "setup: npm install ($package, pinned in $dir/package.json) into $dir/node_modules"
  if (cd "$dir" && timeout 300 npm install --no-audit --no-fund --loglevel=error); then
    echo "setup: installed npm $package for $what"
  else
    echo "setup: WARNING: npm install failed (registry unreachable?); $what will be SKIPPED" \
         "until scripts/setup.sh is rerun with network access" >&2
  fi
  return 0
}

install_npm_oracles() {
  local root
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  install_npm_oracle "$root/tests/k3run/tokenizer/parity" tiktoken/encoders/o200k_base.json \
    tiktoken "the tokenizer parity test"
  install_npm_oracle "$root/tests/k3run/server" openai/package.json openai \
    "the server's openai client test"
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
  install_npm_oracles
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "setup: need root or sudo to install: ${missing[*]}" >&2
  exit 1
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: installed ${missing[*]}"
install_npm_oracles
