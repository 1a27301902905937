#!/usr/bin/env bash
# Regenerates the README's workbench screenshots (docs/screenshots/) with the tour, offscreen.
#   bash scripts/screenshots.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/build.sh" release trainscope trainscope-gui
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
QT_QPA_PLATFORM=offscreen "$root/build/release/gui/trainscope-gui" --tour "$tmp"
mkdir -p "$root/docs/screenshots"
for f in 01-node 03-live 04-timeline 06-bubbles 08-memory 12-ab 13-export 16-moe-routing 17-fp8; do
  cp "$tmp/$f.png" "$root/docs/screenshots/$f.png"
done
echo "updated docs/screenshots/ from the tour"
