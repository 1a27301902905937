#!/usr/bin/env bash
# The main job: install what is missing, build, and open the workbench on the local node.
# Until the Qt workbench lands this runs the headless demo (a real training run on the CPU
# backend with a trace, then the analysis of where the step time went).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Only what the main job needs; the tests and benchmarks build with scripts/test.sh.
gui_target=()
if grep -q "trainscope-gui" "$root/gui/CMakeLists.txt" 2>/dev/null; then gui_target=(trainscope-gui); fi
bash "$root/scripts/build.sh" release trainscope "${gui_target[@]}"
bin="$root/build/release/apps/trainscope"
if [ -x "$root/build/release/gui/trainscope-gui" ] && { [ -n "${DISPLAY:-}" ] || [ -n "${WAYLAND_DISPLAY:-}" ]; }; then
  exec "$root/build/release/gui/trainscope-gui" "$@"
fi
exec "$bin" demo "$@"
