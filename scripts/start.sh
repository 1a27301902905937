#!/usr/bin/env bash
# The main job: install what is missing, build, and open the workbench on the local node.
# Without a display (no $DISPLAY / $WAYLAND_DISPLAY) it says so, runs the headless demo (a real
# training run with its analysis) and writes the workbench's screenshot tour, printing where.
#   bash scripts/start.sh [trainscope-gui args, e.g. --node ssh://host]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/build.sh" release trainscope trainscope-gui
bin="$root/build/release/apps/trainscope"
gui="$root/build/release/gui/trainscope-gui"
if [ ! -x "$gui" ]; then
  echo "trainscope: the workbench was not built (Qt 6 Widgets/Charts not found); running the headless demo instead." >&2
  exec "$bin" demo
fi
if [ -n "${DISPLAY:-}" ] || [ -n "${WAYLAND_DISPLAY:-}" ]; then
  exec "$gui" "$@"
fi
tour="$root/build/tour"
echo "trainscope: no display here (DISPLAY/WAYLAND_DISPLAY unset): running the headless demo, then the workbench tour offscreen into $tour"
"$bin" demo
rm -rf "$tour"
QT_QPA_PLATFORM=offscreen "$gui" --tour "$tour"
echo "trainscope: the workbench's screenshots are in $tour (one PNG per view; tour.json says what each view held)"
