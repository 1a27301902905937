#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh runs on a lent GPU machine into .gpu/ (ignored by git), so that
# the device tool can carry it: the stripped test_gpu, bench_gpu_step, bench_gpu_attention,
# bench_gpu_gemm, bench_moe_routing and trainscope of build/dev,
# and the shared libraries they need that are neither CUDA's (the GPU machine has CUDA 13's
# runtime, cuBLAS, CUPTI and NCCL; gpu_check finds them there) nor the C and C++ runtime's (the
# machine's own are newer than this Debian's, and CUDA's libraries may need them). Everything goes
# into one xz tarball, since OpenBLAS alone is larger than half of what a call may carry.
#
# usage: bash scripts/gpu_bundle.sh            (after cmake --build build/dev --target test_gpu
#                            bench_gpu_step bench_gpu_attention bench_gpu_gemm bench_moe_routing trainscope)
# then, on the GPU machine:  bash scripts/gpu_check.sh --bundle .gpu/bundle.tar.xz
set -euo pipefail
cd "$(dirname "$0")/.."
src=build/dev
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests" "$stage/apps" "$stage/lib" .gpu
for b in tests/test_gpu apps/bench_gpu_step apps/bench_gpu_attention apps/bench_gpu_gemm apps/bench_moe_routing apps/trainscope; do
    [ -x "$src/$b" ] || { echo "gpu_bundle: $src/$b is missing: cmake --build $src --target $(basename "$b")" >&2; exit 1; }
    strip -o "$stage/$b" "$src/$b"
done
# Every library the binaries load, less the C library's own and CUDA's (loaded from the machine).
for b in "$stage"/tests/* "$stage"/apps/*; do ldd "$src/${b#"$stage"/}"; done |
    awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
    grep -v -E '^(libc|libm|libdl|librt|libpthread|libutil|libstdc\+\+|libgcc_s|libz|ld-linux[^ ]*)\.so|^lib(cuda|cudart|cublas|cublasLt|cupti|nccl|nvrtc|nvToolsExt)[.-]' |
    while read -r name path; do cp -L "$path" "$stage/lib/$name"; done
tar -C "$stage" -cJf .gpu/bundle.tar.xz tests apps lib
ls -la .gpu/bundle.tar.xz
tar -tJf .gpu/bundle.tar.xz | tr '\n' ' '
echo
