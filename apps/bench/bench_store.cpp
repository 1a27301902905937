// bench_store: sustained slice throughput into the SQLite run file.
//  1. TraceWriter (one thread, batched transactions): raw store insert rate.
//  2. CaptureRecorder with P producer threads: end-to-end rate (append -> committed), and the
//     producer-side cost per slice() call (what the engine's hot path pays).
// Usage: bench_store [--slices N] [--producers P] [--dir DIR]
// Prints a table and one JSON line.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "apps/bench/bench_args.h"
#include "profiler/store.h"

using namespace ts;
using namespace ts::profiler;

namespace {

// CPU seconds of the whole process: on a shared machine wall time measures the neighbours too.
double cpuS() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

double nowS() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A slice that looks like the engine's: 8 tracks per rank, increasing ts, a few names.
trace::Slice makeSlice(uint32_t track, int64_t i, uint32_t name) {
    trace::Slice s;
    s.track = track;
    s.name = name;
    s.category = trace::Category(i % 8);
    s.startNs = 1'000'000'000'000LL + i * 1000;
    s.durNs = 700 + (i % 13) * 10;
    s.step = int32_t(i / 100000);
    s.microbatch = int32_t((i / 1000) % 8);
    s.layer = int32_t(i % 24);
    s.correlation = uint64_t(i + 1);
    s.bytes = uint64_t((i % 4) * 4096);
    s.flops = double(i % 7) * 1e6;
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    int64_t n = 4'000'000;
    int producers = 2;
    std::string dir = std::filesystem::temp_directory_path().string();
    if (const int rc = ts::bench::checkArgs(argc, argv, "usage: bench_store [--slices N] [--producers P] [--dir DIR]"); rc >= 0) return rc;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string a = argv[i];
        if (a == "--slices") n = std::atoll(argv[i + 1]);
        else if (a == "--producers") producers = std::atoi(argv[i + 1]);
        else if (a == "--dir") dir = argv[i + 1];
        else {
            std::fprintf(stderr, "unknown option %s\nusage: bench_store [--slices N] [--producers P] [--dir DIR]\n", a.c_str());
            return 2;
        }
    }
    std::string pathA = dir + "/bench_store_writer_" + std::to_string(::getpid()) + ".db";
    std::string pathB = dir + "/bench_store_capture_" + std::to_string(::getpid()) + ".db";

    // 1. TraceWriter
    double writerRate = 0, writerCpuRate = 0;
    {
        auto store = TraceStore::create(pathA);
        if (!store) {
            std::fprintf(stderr, "bench_store: %s\n", store.status().toString().c_str());
            return 1;
        }
        TraceWriter w(**store, 1 << 18);
        uint32_t tracks[8], names[16];
        for (int t = 0; t < 8; ++t) tracks[t] = w.track({t / 4, 0, trace::TrackKind(t % 4), 0, "t" + std::to_string(t)});
        for (int k = 0; k < 16; ++k) names[k] = w.intern("kernel_" + std::to_string(k));
        double t0 = nowS(), c0 = cpuS();
        for (int64_t i = 0; i < n; ++i) w.slice(makeSlice(tracks[i % 8], i, names[i % 16]));
        Status st = w.flush();
        double t1 = nowS(), c1 = cpuS();
        writerCpuRate = double(n) / (c1 - c0);
        if (!st) {
            std::fprintf(stderr, "bench_store: %s\n", st.toString().c_str());
            return 1;
        }
        writerRate = double(n) / (t1 - t0);
    }

    // 2. CaptureRecorder with producers
    double captureRate = 0, appendNs = 0, captureCpuS = 0;
    CaptureRecorder::Stats cs;
    {
        auto rec = CaptureRecorder::create(pathB);
        if (!rec) {
            std::fprintf(stderr, "bench_store: %s\n", rec.status().toString().c_str());
            return 1;
        }
        CaptureRecorder& r = **rec;
        std::vector<uint32_t> names;
        for (int k = 0; k < 16; ++k) names.push_back(r.intern("kernel_" + std::to_string(k)));
        std::vector<uint32_t> tracks;
        for (int p = 0; p < producers; ++p) tracks.push_back(r.track({p, 0, trace::TrackKind::Compute, 0, "p" + std::to_string(p)}));
        int64_t per = n / producers;
        std::vector<double> appendTimes(size_t(producers), 0);
        double t0 = nowS(), c0 = cpuS();
        std::vector<std::thread> threads;
        for (int p = 0; p < producers; ++p) {
            threads.emplace_back([&, p] {
                double a0 = nowS();
                for (int64_t i = 0; i < per; ++i) r.slice(makeSlice(tracks[size_t(p)], i, names[size_t(i % 16)]));
                appendTimes[size_t(p)] = nowS() - a0;
            });
        }
        for (auto& t : threads) t.join();
        Status st = r.close();
        double t1 = nowS();
        captureCpuS = cpuS() - c0;  // producers + writer thread
        if (!st) {
            std::fprintf(stderr, "bench_store: %s\n", st.toString().c_str());
            return 1;
        }
        cs = r.stats();
        captureRate = double(cs.slices) / (t1 - t0);
        double sum = 0;
        for (double a : appendTimes) sum += a;
        appendNs = sum / double(per * producers) * 1e9;
    }
    auto fileBytes = [](const std::string& p) {
        std::error_code ec;
        auto s = std::filesystem::file_size(p, ec);
        return ec ? 0.0 : double(s);
    };
    double bytesPerSlice = fileBytes(pathB) / double(std::max<uint64_t>(cs.slices, 1));
    for (const auto& p : {pathA, pathB})
        for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(p + suffix);

    std::printf("bench_store: %lld slices\n", (long long)n);
    std::printf("  TraceWriter (1 thread)            %10.0f slices/s wall, %10.0f slices per CPU-second\n", writerRate, writerCpuRate);
    std::printf("  CaptureRecorder (%d producers)     %10.0f slices/s end-to-end (%llu batches, %llu dropped)\n",
                producers, captureRate, (unsigned long long)cs.batches, (unsigned long long)cs.dropped);
    std::printf("  CaptureRecorder CPU               %10.0f slices per CPU-second (producers + writer, %.2f CPU-s)\n",
                double(cs.slices) / std::max(captureCpuS, 1e-9), captureCpuS);
    std::printf("  producer cost per slice()         %10.1f ns (wall, includes time descheduled)\n", appendNs);
    std::printf("  file size per slice               %10.1f bytes\n", bytesPerSlice);
    nlohmann::json j = {{"bench", "store"},
                        {"slices", n},
                        {"producers", producers},
                        {"writer_slices_per_s", writerRate},
                        {"writer_slices_per_cpu_s", writerCpuRate},
                        {"capture_slices_per_s", captureRate},
                        {"capture_dropped", cs.dropped},
                        {"capture_cpu_s", captureCpuS},
                        {"capture_slices_per_cpu_s", double(cs.slices) / std::max(captureCpuS, 1e-9)},
                        {"append_ns_per_slice", appendNs},
                        {"bytes_per_slice", bytesPerSlice}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
}
