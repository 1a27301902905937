#!/usr/bin/env bash
# What a session lent a GPU runs for issue #17 (docs/cuda_port.md), as one script: every
# gpu-labelled test (kernels against the CPU oracle, the CUDA device backend, NCCL, CUPTI, and
# CudaTrainer: the single-device trainer on GPU 0 against the CPU backend), then the speed checks
# (bench_gpu_step: step time, MFU and peak memory of the small and the ~1.3B GPT, bf16 and FP8,
# flash attention and, once, the probabilities kept), and a user's
# path end to end: `trainscope run` of resources/examples/small.yaml on GPU 0 (CUPTI capture on)
# and `trainscope analyze` of its run file. Logs, the
# tests' JSON report and the benchmarks' JSON lines go to $OUT (the device tool's output folder),
# else build/gpu_check. Device time is scarce: build here first where the machine allows
# (cmake --preset dev; cmake --build build/dev --target test_gpu bench_gpu_step), or pass --build
# to build on the GPU machine (sm_90 only, all its cores).
#
# usage: bash scripts/gpu_check.sh [--build] [--no-bench] [--bin DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-build/gpu_check}"
bin=build/dev
build=0
bench=1
while [ $# -gt 0 ]; do
    case "$1" in
        --build) build=1 ;;
        --no-bench) bench=0 ;;
        --bin) bin="$2"; shift ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$out"
{ nvidia-smi; nvidia-smi topo -m; } > "$out/nvidia-smi.txt" 2>&1 || echo "gpu_check: nvidia-smi failed (see $out/nvidia-smi.txt)"
if [ "$build" = 1 ]; then
    cmake --preset dev -DCMAKE_CUDA_ARCHITECTURES=90 > "$out/configure.log" 2>&1 &&
        cmake --build "$bin" -j"$(nproc)" --target test_gpu bench_gpu_step trainscope > "$out/build.log" 2>&1 ||
        { echo "gpu_check: build failed, see $out/build.log"; tail -30 "$out/build.log"; exit 1; }
fi
for b in "$bin/tests/test_gpu" "$bin/apps/bench_gpu_step"; do
    [ -x "$b" ] || { echo "gpu_check: $b is missing: build it or pass --build"; exit 1; }
done
status=0
echo "== test_gpu"
"$bin/tests/test_gpu" --gtest_output=json:"$out/test_gpu.json" > "$out/test_gpu.log" 2>&1 || status=1
grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/test_gpu.log" | head -60
grep -F -e '[cuda trainer]' -e '[cuda parallel]' -e '[gpu capture]' "$out/test_gpu.log"
if [ -x "$bin/apps/trainscope" ]; then
    echo "== trainscope run + analyze on GPU 0"
    runfile="$out/small_cuda.tsrun"
    TS_CUDA_UNVERIFIED=1 timeout 180 "$bin/apps/trainscope" run resources/examples/small.yaml --steps 4 \
        --set device_backend=cuda --set bf16=true --run-file "$runfile" > "$out/run.log" 2>&1 || status=1
    tail -3 "$out/run.log"
    timeout 120 "$bin/apps/trainscope" analyze "$runfile" > "$out/analyze.txt" 2>&1 || status=1
    head -40 "$out/analyze.txt"
fi
if [ "$bench" = 1 ]; then
    for args in "--config small --steps 5 --warmup 2 --trace 1" "--config 1b --steps 5 --warmup 2 --trace 1" \
                "--config 1b --steps 5 --warmup 2 --fp8 hybrid" "--config 1b --steps 5 --warmup 2 --attention unfused"; do
        echo "== bench_gpu_step $args"
        # shellcheck disable=SC2086
        timeout 240 "$bin/apps/bench_gpu_step" $args 2>&1 | tee -a "$out/bench_gpu_step.log" | tail -3 || status=1
    done
fi
exit "$status"
