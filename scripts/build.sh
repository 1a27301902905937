#!/usr/bin/env bash
# Configures and builds one preset (default: release) after making sure dependencies exist.
#   bash scripts/build.sh [dev|release|asan|cpu] [TARGET ...]   (no target: everything)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=deps.sh
source "$root/scripts/deps.sh"
ts_install_deps
preset="${1:-release}"
shift || true
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cd "$root"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)" "${targets[@]}"
