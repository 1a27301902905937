#!/usr/bin/env bash
# What a session lent a GPU runs for issue #17 (docs/cuda_port.md), as one script: every
# gpu-labelled test (kernels against the CPU oracle, the CUDA device backend, NCCL, CUPTI, and
# CudaTrainer: the single-device trainer on GPU 0 against the CPU backend), one test suite per
# process under its own time limit, then a user's path end to end (`trainscope run` of
# resources/examples/small.yaml on GPU 0 with the CUPTI capture on, and `trainscope analyze` of its
# run file; once more as TP 2 x PP 2 with the four ranks sharing the GPUs), then the speed checks (bench_gpu_step: step time, MFU and peak memory of the small and
# the ~1.3B GPT, bf16 and FP8, flash attention and, once, the probabilities kept; once with the
# saved activations in fp32 words, TS_BF16_SAVED_FP32=1, against their bf16 packing; once with the
# tiled flash kernels, TS_CUDA_FLASH_TILES=1, against the GEMM path; once with cuBLAS converting the
# bf16 GEMMs' operands, TS_CUDA_GEMM_FAST_16BF=1; once FP8 hybrid with its GEMMs on the FP8 tensor
# cores, TS_CUDA_FP8_GEMMS=1; bench_gpu_attention: the
# attention alone, tiled against GEMMs, forward and backward; bench_gpu_gemm: the linear layers' GEMMs
# in each precision path against cuBLAS on converted operands), and
# bench_moe_routing --device cuda (the MoE router's kernels on the GPU, every mode: sinkhorn and
# quantile balancing included).
# Logs, the tests' JSON reports and the benchmarks' JSON lines go into one tarball,
# gpu_check.tar.gz, in $OUT (the device tool's output folder, which brings back few files), else in
# build/gpu_check; a summary goes to stdout.
#
# Device time is scarce. Build here first (cmake --preset dev; cmake --build build/dev --target
# test_gpu bench_gpu_step bench_gpu_attention bench_gpu_gemm bench_moe_routing trainscope), then either run on a machine that has this
# checkout's build (--bin DIR, default build/dev), or pack the binaries and their non-CUDA libraries with
# scripts/gpu_bundle.sh and pass --bundle .gpu/bundle.tar.xz where only the checkout travels (the
# machine must have CUDA 13's runtime, cuBLAS, CUPTI and NCCL; they are looked for under
# /usr/local and Python's nvidia packages). --build builds on the GPU machine instead (sm_90 only,
# all its cores). --deadline S stops starting new steps once S seconds have passed, and shortens
# each step's limit to what is left, so that the whole script ends inside a lease.
#
# --quick: the kernel, attention and trainer suites and a few ~1.3B GPT steps only (a re-measure).
#
# usage: bash scripts/gpu_check.sh [--build | --bundle FILE | --bin DIR] [--no-bench] [--quick] [--deadline S]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-build/gpu_check}"
bin=build/dev
bundle=""
build=0
bench=1
deadline=100000
quick=0
while [ $# -gt 0 ]; do
    case "$1" in
        --build) build=1 ;;
        --no-bench) bench=0 ;;
        --quick) quick=1 ;;
        --bin) bin="$2"; shift ;;
        --bundle) bundle="$2"; shift ;;
        --deadline) deadline="$2"; shift ;;
        -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
work=$(mktemp -d /tmp/gpu_check.XXXX)
mkdir -p "$out"
status=0

# Seconds left before the deadline, capped at $1: the limit of the next step (0: skip it).
limit() {
    local left=$((deadline - SECONDS))
    [ "$left" -lt 10 ] && { echo 0; return; }
    [ "$left" -lt "$1" ] && { echo "$left"; return; }
    echo "$1"
}
# Runs the command under the step's limit (see limit), or not at all past the deadline (timeout 0
# would mean no limit).
within() {
    local t
    t=$(limit "$1")
    shift
    if [ "$t" = 0 ]; then
        echo "gpu_check: not run (deadline): $*" >&2
        return 124
    fi
    timeout "$t" "$@"
}
finish() {
    # The device tool brings back files of at most 16 MiB: run files and other large files stay.
    find "$work" -type f -size +4M -printf 'gpu_check: left out of the tarball: %P (%s bytes)\n'
    tar -C "$work" --exclude="*.tsrun*" --exclude-from=<(find "$work" -type f -size +4M -printf '%P\n') \
        -czf "$out/gpu_check.tar.gz" . 2>/dev/null
    echo "gpu_check: ${SECONDS}s, logs in $out/gpu_check.tar.gz, status $status"
    exit "$status"
}

# Stopped from outside (the device tool's limit): still bring back what there is.
trap 'echo "gpu_check: stopped by a signal"; status=1; finish' TERM INT
{ nvidia-smi; nvidia-smi topo -m; } > "$work/nvidia-smi.txt" 2>&1 || echo "gpu_check: nvidia-smi failed (see nvidia-smi.txt)"
head -12 "$work/nvidia-smi.txt" | grep -E 'Driver|NVIDIA H|MiB' | head -3
if [ -n "$bundle" ]; then
    bin="$work.bin"
    mkdir -p "$bin" && tar -C "$bin" -xJf "$bundle" || { echo "gpu_check: cannot unpack $bundle"; status=1; finish; }
    # CUDA's libraries from the machine: the toolkit's folders, then Python's nvidia wheels.
    dirs=""
    for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcupti.so.13 libnccl.so.2; do
        found=$(find /usr/local /usr/lib /opt -name "$lib" 2>/dev/null | head -1)
        [ -n "$found" ] || { echo "gpu_check: $lib is not on this machine"; continue; }
        case ":$dirs:" in *":$(dirname "$found"):"*) ;; *) dirs="$dirs:$(dirname "$found")" ;; esac
    done
    export LD_LIBRARY_PATH="$bin/lib$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "gpu_check: LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
fi
if [ "$build" = 1 ]; then
    cmake --preset dev -DCMAKE_CUDA_ARCHITECTURES=90 > "$work/configure.log" 2>&1 &&
        cmake --build "$bin" -j"$(nproc)" --target test_gpu bench_gpu_step bench_gpu_attention bench_gpu_gemm bench_moe_routing trainscope \
            > "$work/build.log" 2>&1 ||
        { echo "gpu_check: build failed, see build.log"; tail -30 "$work/build.log"; status=1; finish; }
fi
for b in "$bin/tests/test_gpu" "$bin/apps/bench_gpu_step"; do
    [ -x "$b" ] || { echo "gpu_check: $b is missing: build it, pass --build or --bundle"; status=1; finish; }
done
missing=$(ldd "$bin/tests/test_gpu" "$bin/apps/bench_gpu_step" 2>&1 | grep 'not found' | sort -u)
[ -z "$missing" ] || { echo "gpu_check: libraries not found:"; echo "$missing"; status=1; finish; }

echo "== test_gpu (one suite per process)"
suites=$("$bin/tests/test_gpu" --gtest_list_tests | grep -E '^[A-Za-z][A-Za-z0-9_/]*\.$' | tr -d '.')
[ -n "$suites" ] || { echo "gpu_check: test_gpu lists no test suites"; status=1; }
for suite in $suites; do
    [ "$quick" = 1 ] && case "$suite" in KernelsCuda|CudaAttention|CudaTrainer) ;; *) continue ;; esac
    t=$(limit 150)
    [ "$t" = 0 ] && { echo "$suite: not run (deadline)"; status=1; continue; }
    start=$SECONDS
    timeout "$t" "$bin/tests/test_gpu" --gtest_filter="$suite.*" --gtest_output=json:"$work/test_$suite.json" \
        > "$work/test_$suite.log" 2>&1
    rc=$?
    [ "$rc" = 0 ] || status=1
    [ "$rc" = 124 ] && echo "$suite: TIMED OUT after ${t}s"
    echo "$suite: rc=$rc $((SECONDS - start))s $(sed -nE 's/^\[  (PASSED|FAILED|SKIPPED) +\] ([0-9]+) tests?[,.].*/\1 \2/p' "$work/test_$suite.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \] [A-Za-z]' "$work/test_$suite.log" | grep -v ' listed below' | sort -u
    grep -F -e '[cuda trainer]' -e '[cuda parallel]' -e '[gpu capture]' -e '[fast 16bf]' "$work/test_$suite.log"
done
# The first lines of each failure, to read without unpacking the tarball.
for f in "$work"/test_*.log; do
    grep -B2 -A8 -E 'Failure$|error:' "$f" | head -40
done | head -150

if [ "$quick" = 0 ] && [ -x "$bin/apps/trainscope" ] && [ "$(limit 120)" != 0 ]; then
    echo "== trainscope run + analyze on GPU 0"
    runfile="$work/small_cuda.tsrun"
    within 120 "$bin/apps/trainscope" run resources/examples/small.yaml --steps 4 \
        --set device_backend=cuda --set bf16=true --run-file "$runfile" > "$work/run.log" 2>&1 || status=1
    tail -2 "$work/run.log"
    within 60 "$bin/apps/trainscope" analyze "$runfile" --step 3 > "$work/analyze.txt" 2>&1 || status=1
    sed -n '/^step 3/,/^  critical/p; /^MFU inputs/p' "$work/analyze.txt"
fi
if [ "$quick" = 0 ] && [ -x "$bin/apps/trainscope" ] && [ "$(limit 120)" != 0 ]; then
    # Four ranks (TP 2 with SP, PP 2) on however many GPUs there are, sharing them: the CUDA paths
    # of a layout and the capture's per-rank tracks, end to end, on one GPU.
    echo "== trainscope run + analyze: tp2 pp2, the ranks sharing the GPUs"
    within 120 env TS_CUDA_UNVERIFIED=1 "$bin/apps/trainscope" run resources/examples/small.yaml \
        --steps 3 --set device_backend=cuda --set cuda_share_gpus=true --set tensor_model_parallel_size=2 \
        --set sequence_parallel=true \
        --set pipeline_model_parallel_size=2 --run-file "$work/shared_cuda.tsrun" > "$work/run_shared.log" 2>&1 || status=1
    tail -2 "$work/run_shared.log"
    within 60 "$bin/apps/trainscope" analyze "$work/shared_cuda.tsrun" --step 2 > "$work/analyze_shared.txt" 2>&1 || status=1
    sed -n '1,/^step 2/p' "$work/analyze_shared.txt" | grep -E '^run|^caution'
    sed -n '/^step 2/,/^  critical/p' "$work/analyze_shared.txt"
fi
if [ "$bench" = 1 ] && [ "$quick" = 0 ] && [ -x "$bin/apps/trainscope" ] && [ "$(limit 150)" != 0 ]; then
    # Where the ~1.3B GPT's step goes: its last step's kernel mix, as `trainscope analyze` shows it.
    echo "== trainscope run + analyze: the ~1.3B GPT, bf16, 3 steps"
    within 150 "$bin/apps/trainscope" run resources/examples/small.yaml --steps 3 \
        --set device_backend=cuda --set bf16=true --set hidden_size=2048 --set num_layers=24 \
        --set num_attention_heads=16 --set seq_length=2048 --set micro_batch_size=1 --set vocab_size=50304 \
        --run-file "$work/gpt1b_cuda.tsrun" > "$work/run_1b.log" 2>&1 || status=1
    tail -2 "$work/run_1b.log"
    within 60 "$bin/apps/trainscope" analyze "$work/gpt1b_cuda.tsrun" --step 2 --top 30 \
        > "$work/analyze_1b.txt" 2>&1 || status=1
    sed -n '/^step 2/,/^MFU inputs/p' "$work/analyze_1b.txt"
fi
if [ "$bench" = 1 ]; then
    # --trace engine: the engine's recorder alone, to split the trace overhead into its share and CUPTI's.
    # TS_BF16_SAVED_FP32=1: the saved activations in fp32 words, to measure what packing them to
    # bf16 saves in memory and costs in time (an entry's leading NAME=VALUE words are its environment).
    # TS_CUDA_FLASH_TILES=1: flash attention by the tiled kernels (flash_attention.cu), against the GEMM path.
    # TS_CUDA_GEMM_FAST_16BF=1: bf16 GEMMs on fp32 operands that cuBLAS converts itself (gemm.cu).
    # TS_CUDA_FP8_GEMMS=1: delayed scaling's GEMMs on the FP8 tensor cores (gemm.cu), against bf16 ones.
    benches=("--config small --steps 5 --warmup 2 --trace 1" "--config 1b --steps 5 --warmup 2 --trace 1"
             "--config 1b --steps 5 --warmup 2 --trace engine"
             "TS_BF16_SAVED_FP32=1 --config 1b --steps 5 --warmup 2"
             "TS_CUDA_FLASH_TILES=1 --config 1b --steps 5 --warmup 2"
             "TS_CUDA_GEMM_FAST_16BF=1 --config 1b --steps 5 --warmup 2"
             "--config 1b --steps 5 --warmup 2 --fp8 hybrid"
             "TS_CUDA_FP8_GEMMS=1 --config 1b --steps 5 --warmup 2 --fp8 hybrid"
             "--config 1b --steps 5 --warmup 2 --fp8 hybrid --fp8-recipe tensorwise"
             "--config 1b --steps 5 --warmup 2 --fp8 e4m3 --fp8-recipe mxfp8"
             "--config 1b --steps 5 --warmup 2 --attention unfused"
             "--config small --steps 5 --warmup 2"
             "--config small --steps 5 --warmup 2 --cuda-graph full_iteration"
             "--config 1b --steps 5 --warmup 2 --cuda-graph full_iteration"
             "TS_CUDA_FP8_GEMMS=1 --config 1b --steps 5 --warmup 2 --fp8 hybrid --cuda-graph full_iteration")
    [ "$quick" = 1 ] && benches=("--config 1b --steps 5 --warmup 2" "TS_BF16_SAVED_FP32=1 --config 1b --steps 5 --warmup 2"
                                 "TS_CUDA_FLASH_TILES=1 --config 1b --steps 5 --warmup 2"
                                 "TS_CUDA_GEMM_FAST_16BF=1 --config 1b --steps 5 --warmup 2"
                                 "--config 1b --steps 5 --warmup 2 --fp8 hybrid"
                                 "TS_CUDA_FP8_GEMMS=1 --config 1b --steps 5 --warmup 2 --fp8 hybrid")
    for args in "${benches[@]}"; do
        envs=()
        while [[ "$args" == TS_*=*" "* ]]; do envs+=("${args%% *}"); args="${args#* }"; done
        t=$(limit 150)
        [ "$t" = 0 ] && { echo "bench_gpu_step ${envs[*]} $args: not run (deadline)"; continue; }
        echo "== bench_gpu_step ${envs[*]:+${envs[*]} }$args"
        # shellcheck disable=SC2086
        timeout "$t" env "${envs[@]}" "$bin/apps/bench_gpu_step" $args > "$work/bench.log" 2>&1 || status=1
        tail -4 "$work/bench.log"
        cat "$work/bench.log" >> "$work/bench_gpu_step.log"
    done
fi
if [ "$bench" = 1 ] && [ -x "$bin/apps/bench_gpu_attention" ]; then
    # Flash attention alone at the ~1.3B GPT's shape: the tiled kernels against the GEMM path.
    for args in "" "--dropout 0.1" "--heads 32 --kv-heads 8 --d 64"; do
        [ "$(limit 60)" = 0 ] && { echo "bench_gpu_attention $args: not run (deadline)"; continue; }
        echo "== bench_gpu_attention $args"
        # shellcheck disable=SC2086
        within 60 "$bin/apps/bench_gpu_attention" $args > "$work/bench_attn.log" 2>&1 || status=1
        cat "$work/bench_attn.log"
        cat "$work/bench_attn.log" >> "$work/bench_gpu_attention.log"
    done
fi
if [ "$bench" = 1 ] && [ -x "$bin/apps/bench_gpu_gemm" ]; then
    # The linear layers' GEMMs alone in each precision path (fp32, bf16, FP8 codes on bf16 and on
    # FP8 tensor cores), against cuBLAS on operands converted beforehand.
    if [ "$(limit 90)" = 0 ]; then echo "bench_gpu_gemm: not run (deadline)"; else
        echo "== bench_gpu_gemm"
        within 90 "$bin/apps/bench_gpu_gemm" > "$work/bench_gpu_gemm.log" 2>&1 || status=1
        grep -v "^{" "$work/bench_gpu_gemm.log"  # the JSON line stays in the log
    fi
fi
if [ "$bench" = 1 ] && [ -x "$bin/apps/bench_moe_routing" ]; then
    # The MoE router's kernels on the GPU, every mode (the device column of the routing's cost).
    echo "== bench_moe_routing --device cuda"
    within 60 "$bin/apps/bench_moe_routing" --reps 3 --device cuda > "$work/bench_moe_routing.log" 2>&1 || status=1
    cat "$work/bench_moe_routing.log"
fi
finish
