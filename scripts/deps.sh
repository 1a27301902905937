#!/usr/bin/env bash
# Installs the Debian packages trainscope needs, only those that are missing.
# Sourced by start.sh and test.sh; safe to run on its own: `bash scripts/deps.sh`.
set -euo pipefail

TS_PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3
  libsqlite3-dev zlib1g-dev nlohmann-json3-dev libyaml-cpp-dev
  libopenblas-dev libgtest-dev libgmock-dev
  openmpi-bin libopenmpi-dev
  qt6-base-dev qt6-charts-dev libqt6opengl6-dev
  xvfb xauth
)

ts_missing_packages() {
  local missing=()
  for p in "${TS_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  echo "${missing[@]:-}"
}

ts_install_deps() {
  if ! command -v dpkg-query >/dev/null; then
    echo "trainscope: not a Debian-based system; install the equivalents of: ${TS_PACKAGES[*]}" >&2
    return 0
  fi
  local missing
  missing=$(ts_missing_packages)
  [ -z "$missing" ] && return 0
  echo "trainscope: installing missing packages: $missing"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo="sudo"
    elif command -v sudo >/dev/null && [ -t 0 ]; then
      sudo="sudo"
      echo "trainscope: installing system packages needs root; sudo will ask for your password."
    else
      echo "trainscope: these Debian packages are missing and installing them needs root:" >&2
      echo "    sudo apt-get install -y $missing" >&2
      echo "  run that (or run this script as root), then run this command again." >&2
      return 1
    fi
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  # shellcheck disable=SC2086
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  ts_install_deps
fi
