#!/usr/bin/env bash
# The whole test suite: install what is missing, build the dev preset (tests + benches),
# run every CTest test. Exits non-zero on any failure. `.ci/run` calls exactly this.
#   bash scripts/test.sh [extra ctest args, e.g. -L kernels]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/build.sh" dev
cd "$root/build/dev"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export QT_QPA_PLATFORM=offscreen
ctest --output-on-failure --no-tests=error -j 2 "$@"
