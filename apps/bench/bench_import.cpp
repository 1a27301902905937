// Benchmark: import of a large PyTorch/Kineto JSON trace (issue 5 target: a 100 MB file in
// under 10 s with peak memory below 2x the file size).
//
// Writes a synthetic Kineto trace shaped like a real one (ProfilerStep ranges, cpu_op with
// Input Dims, cudaLaunchKernel + kernel pairs with the full CUPTI args, NCCL kernels on their
// own stream, copies, [memory] instants, ac2g flows; decimal µs timestamps relative to
// baseTimeNanoseconds) into a temp dir, then imports it into a run file exactly as
// `trainscope import` does. Prints the numbers and one JSON line.
//
//   bench_import [--mb 100] [--gzip] [--sink] [--keep]
//     --gzip  compress the generated file (import then inflates while parsing)
//     --sink  import into a counting Recorder instead of a run file (parser cost alone)
#include <sys/resource.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include <zlib.h>

#include "profiler/import/import_run.h"
#include "profiler/import/importer.h"

namespace {

using Clock = std::chrono::steady_clock;

class Out {
public:
    Out(const std::string& path, bool gzip) : m_gzip(gzip) {
        if (gzip) m_gz = gzopen(path.c_str(), "wb1");
        else m_file = std::fopen(path.c_str(), "wb");
        m_buf.reserve(1 << 20);
    }
    ~Out() {
        flush();
        if (m_gz) gzclose(m_gz);
        if (m_file) std::fclose(m_file);
    }
    bool ok() const { return m_gz || m_file; }
    template <typename... A>
    void printf(const char* fmt, A... args) {
        char line[2048];
        int n = std::snprintf(line, sizeof line, fmt, args...);
        m_buf.append(line, static_cast<size_t>(n));
        m_bytes += static_cast<uint64_t>(n);
        if (m_buf.size() > (1u << 20)) flush();
    }
    uint64_t bytes() const { return m_bytes; }

private:
    void flush() {
        if (m_buf.empty()) return;
        if (m_gz) gzwrite(m_gz, m_buf.data(), static_cast<unsigned>(m_buf.size()));
        else if (m_file) std::fwrite(m_buf.data(), 1, m_buf.size(), m_file);
        m_buf.clear();
    }
    bool m_gzip;
    gzFile m_gz = nullptr;
    std::FILE* m_file = nullptr;
    std::string m_buf;
    uint64_t m_bytes = 0;
};

const char* kKernels[] = {
    "void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_tn_align8>(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_tn_align8::Params)",
    "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false>(Flash_fwd_params)",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)",
};

struct GenStats {
    uint64_t events = 0;
    uint64_t jsonBytes = 0;  // uncompressed size
    double seconds = 0;
};

// Roughly 1.9 KB of JSON per launched kernel (cpu_op + runtime + kernel + 2 flows).
GenStats generate(const std::string& path, uint64_t targetBytes, bool gzip) {
    auto t0 = Clock::now();
    Out out(path, gzip);
    GenStats g;
    if (!out.ok()) return g;
    out.printf("{\n  \"schemaVersion\": 1,\n  \"distributedInfo\": {\"backend\": \"nccl\", \"rank\": 0, \"world_size\": 8},\n"
               "  \"deviceProperties\": [{\"id\": 0, \"name\": \"NVIDIA H100 80GB HBM3\"}],\n  \"traceEvents\": [\n");
    const int pid = 4242, tid = 4242;
    double ts = 1000.0;  // us relative to baseTimeNanoseconds
    uint64_t corr = 1000;
    bool first = true;
    auto sep = [&] {
        if (!first) out.printf(",\n");
        first = false;
    };
    for (int step = 0; out.bytes() < targetBytes; ++step) {
        const int kernelsPerStep = 2000;
        const double stepStart = ts;
        sep();
        out.printf("  {\"ph\": \"X\", \"cat\": \"user_annotation\", \"name\": \"ProfilerStep#%d\", \"pid\": %d, \"tid\": %d, "
                   "\"ts\": %.3f, \"dur\": %.3f, \"args\": {\"External id\": %d, \"Record function id\": 0, \"Ev Idx\": 0}}",
                   step, pid, tid, stepStart, kernelsPerStep * 12.0 + 5.0, step * 100000);
        ++g.events;
        for (int k = 0; k < kernelsPerStep && out.bytes() < targetBytes; ++k, ++corr) {
            const bool nccl = k % 25 == 24;
            const char* kname = nccl ? "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
                                     : kKernels[k % 4];
            const int stream = nccl ? 20 : 7;
            sep();
            out.printf("  {\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::%s\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, "
                       "\"dur\": %.3f, \"args\": {\"External id\": %llu, \"Record function id\": 0, \"Ev Idx\": %llu, "
                       "\"Input Dims\": [[8192, 4096], [4096, 4096], []], \"Input type\": [\"c10::BFloat16\", "
                       "\"c10::BFloat16\", \"\"], \"Input Strides\": [[4096, 1], [1, 4096], []], \"Concrete Inputs\": "
                       "[\"\", \"\", \"\"], \"Fwd thread id\": 0, \"Sequence number\": %llu}}",
                       nccl ? "all_reduce" : "mm", pid, tid, ts, 8.0, static_cast<unsigned long long>(corr),
                       static_cast<unsigned long long>(corr), static_cast<unsigned long long>(corr));
            sep();
            out.printf("  {\"ph\": \"X\", \"cat\": \"cuda_runtime\", \"name\": \"cudaLaunchKernel\", \"pid\": %d, \"tid\": %d, "
                       "\"ts\": %.3f, \"dur\": %.3f, \"args\": {\"External id\": %llu, \"cbid\": 211, \"correlation\": %llu}}",
                       pid, tid, ts + 1.0, 4.5, static_cast<unsigned long long>(corr), static_cast<unsigned long long>(corr));
            sep();
            out.printf("  {\"ph\": \"s\", \"id\": %llu, \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"cat\": \"ac2g\", \"name\": \"ac2g\"}",
                       static_cast<unsigned long long>(corr), pid, tid, ts + 1.0);
            const double kts = ts + 20.0;
            sep();
            out.printf("  {\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"%s\", \"pid\": 0, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, "
                       "\"args\": {\"External id\": %llu, \"queued\": 0, \"device\": 0, \"context\": 1, \"stream\": %d, "
                       "\"correlation\": %llu, \"registers per thread\": 168, \"shared memory\": 73728, \"blocks per SM\": 1.2, "
                       "\"warps per SM\": 9.6, \"grid\": [132, 1, 1], \"block\": [256, 1, 1], \"est. achieved occupancy %%\": 12%s}}",
                       kname, stream, kts, nccl ? 30.0 : 10.5, static_cast<unsigned long long>(corr), stream,
                       static_cast<unsigned long long>(corr),
                       nccl ? ", \"In msg nelems\": 1048576, \"Out msg nelems\": 1048576, \"dtype\": \"BFloat16\", "
                              "\"Process Group Name\": \"0\", \"Process Group Description\": \"dp\"" : "");
            sep();
            out.printf("  {\"ph\": \"f\", \"id\": %llu, \"pid\": 0, \"tid\": %d, \"ts\": %.3f, \"cat\": \"ac2g\", \"name\": \"ac2g\", \"bp\": \"e\"}",
                       static_cast<unsigned long long>(corr), stream, kts);
            g.events += 5;
            if (k % 50 == 0) {
                sep();
                out.printf("  {\"ph\": \"i\", \"cat\": \"cpu_instant_event\", \"s\": \"t\", \"name\": \"[memory]\", \"pid\": %d, "
                           "\"tid\": %d, \"ts\": %.3f, \"args\": {\"Device Type\": 1, \"Device Id\": 0, \"Addr\": 139926520725504, "
                           "\"Bytes\": 5242880, \"Total Allocated\": %llu, \"Total Reserved\": 12782141440}}",
                           pid, tid, ts + 2.0, static_cast<unsigned long long>(5435638784ull + uint64_t(k) * 4096));
                sep();
                out.printf("  {\"ph\": \"X\", \"cat\": \"gpu_memcpy\", \"name\": \"Memcpy DtoD (Device -> Device)\", \"pid\": 0, "
                           "\"tid\": 7, \"ts\": %.3f, \"dur\": 2.000, \"args\": {\"External id\": %llu, \"device\": 0, \"context\": 1, "
                           "\"stream\": 7, \"correlation\": %llu, \"bytes\": 5177344, \"memory bandwidth (GB/s)\": 339.2}}",
                           kts + 11.0, static_cast<unsigned long long>(corr), static_cast<unsigned long long>(corr));
                g.events += 2;
            }
            ts += 12.0;
        }
    }
    out.printf("\n  ],\n  \"traceName\": \"bench\",\n  \"displayTimeUnit\": \"ms\",\n  \"baseTimeNanoseconds\": 1700000000000000000\n}\n");
    g.jsonBytes = out.bytes();
    g.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return g;
}

class CountingRecorder : public ts::trace::Recorder {
public:
    uint32_t track(const ts::trace::TrackDesc&) override { return tracks++; }
    uint32_t intern(std::string_view) override { return ++strings; }
    void slice(const ts::trace::Slice&) override { ++slices; }
    void counter(const ts::trace::Counter&) override { ++counters; }
    void metadata(std::string_view, std::string_view) override {}
    uint64_t nextCorrelation() override { return ++corr; }
    uint32_t tracks = 0, strings = 0;
    uint64_t slices = 0, counters = 0, corr = 0;
};

double peakRssMb() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_maxrss) / 1024.0;  // ru_maxrss is KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
    double mb = 100;
    bool gzip = false, sink = false, keep = false;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--mb") && i + 1 < argc) mb = std::atof(argv[++i]);
        else if (!std::strcmp(argv[i], "--gzip")) gzip = true;
        else if (!std::strcmp(argv[i], "--sink")) sink = true;
        else if (!std::strcmp(argv[i], "--keep")) keep = true;
        else {
            std::fprintf(stderr, "usage: bench_import [--mb N] [--gzip] [--sink] [--keep]\n");
            return 2;
        }
    }
    namespace fs = std::filesystem;
    fs::path dir = fs::temp_directory_path() / ("trainscope_bench_import_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::string trace = (dir / (gzip ? "trace.json.gz" : "trace.json")).string();
    const std::string run = (dir / "run.sqlite").string();

    GenStats gen = generate(trace, static_cast<uint64_t>(mb * 1e6), gzip);
    const double fileMb = static_cast<double>(fs::file_size(trace)) / 1e6;
    const double jsonMb = static_cast<double>(gen.jsonBytes) / 1e6;  // the memory target is about this
    const double rssBefore = peakRssMb();
    std::printf("generated %s: %.1f MB of JSON (%.1f MB on disk), %llu events in %.1f s (peak RSS so far %.1f MB)\n",
                trace.c_str(), jsonMb, fileMb, static_cast<unsigned long long>(gen.events), gen.seconds, rssBefore);

    // CPU seconds of the process: on a shared machine wall time also measures the neighbours.
    auto cpuS = [] {
        timespec t{};
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
        return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
    };
    auto t0 = Clock::now();
    const double c0 = cpuS();
    int64_t slices = 0, counters = 0;
    std::string error;
    if (sink) {
        CountingRecorder rec;
        auto r = ts::profiler::import::importTraces({trace}, rec);
        if (!r) error = r.status().toString();
        slices = static_cast<int64_t>(rec.slices);
        counters = static_cast<int64_t>(rec.counters);
    } else {
        auto r = ts::profiler::import::importToRunFile({trace}, run);
        if (!r) error = r.status().toString();
        else {
            slices = r->summary.slices;
            counters = r->summary.counters;
        }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const double cpuSeconds = cpuS() - c0;
    const double rss = peakRssMb();
    if (!error.empty()) {
        std::fprintf(stderr, "import failed: %s\n", error.c_str());
        return 1;
    }
    const double runMb = sink ? 0.0 : static_cast<double>(fs::file_size(run)) / 1e6;
    std::printf("imported into %s: %lld slices, %lld counters in %.2f s (%.0f slices/s, %.1f MB/s of JSON)\n",
                sink ? "a counting recorder" : "a run file", static_cast<long long>(slices),
                static_cast<long long>(counters), seconds, static_cast<double>(slices) / seconds, jsonMb / seconds);
    std::printf("  CPU time %.2f s\n", cpuSeconds);
    std::printf("peak RSS %.1f MB = %.2fx the JSON size (target < 2x; run file %.1f MB)\n", rss, rss / jsonMb, runMb);
    std::printf("{\"bench\": \"import\", \"format\": \"kineto\", \"gzip\": %s, \"sink\": %s, \"json_mb\": %.1f, "
                "\"file_mb\": %.1f, \"events\": %llu, \"slices\": %lld, \"seconds\": %.3f, \"cpu_s\": %.3f, \"peak_rss_mb\": %.1f, "
                "\"rss_over_json\": %.3f, \"run_file_mb\": %.1f}\n",
                gzip ? "true" : "false", sink ? "true" : "false", jsonMb, fileMb, static_cast<unsigned long long>(gen.events),
                static_cast<long long>(slices), seconds, cpuSeconds, rss, rss / jsonMb, runMb);
    if (!keep) fs::remove_all(dir);
    else std::printf("kept %s\n", dir.c_str());
    return 0;
}
