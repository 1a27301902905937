// Fuzz target for the Kineto / Chrome-trace JSON importer (profiler/import/kineto_import.cpp,
// driven through importTraces: format detection, SAX parsing, staging, emission). Any bytes,
// plain or gzip-compressed, must give a Status or a trace whose every string is valid UTF-8
// and whose rows reference what was emitted before them.
//
// Input: byte 0 bit 0 set -> the rest is gzip-compressed before it is written (so the fuzzer
// reaches the JSON parser through the gzip reader too); the rest is the file content.
//   libFuzzer (clang): fuzz_kineto -max_total_time=600 apps/fuzz/corpus/kineto
//   replay (built by default): fuzz_kineto_replay --seconds 3 apps/fuzz/corpus/kineto
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "apps/fuzz/fuzz_import_common.h"
#include "profiler/import/importer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0 || size > (1u << 20)) return 0;
    const std::string& path = ts::fuzz::scratchPath(".json");
    if (data[0] & 1) {
        std::vector<uint8_t> gz(compressBound(uLong(size)) + 64);
        z_stream z{};
        deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // gzip wrapper
        z.next_in = const_cast<Bytef*>(data + 1);
        z.avail_in = uInt(size - 1);
        z.next_out = gz.data();
        z.avail_out = uInt(gz.size());
        deflate(&z, Z_FINISH);
        const size_t n = gz.size() - z.avail_out;
        deflateEnd(&z);
        // Bit 1 cuts the compressed stream short (a truncated download).
        ts::fuzz::writeScratch(path, gz.data(), (data[0] & 2) ? n / 2 : n);
    } else {
        ts::fuzz::writeScratch(path, data + 1, size - 1);
    }
    ts::fuzz::CheckingRecorder rec;
    ts::profiler::import::ImportOptions options;
    options.dropLastProfilerStep = (data[0] & 4) != 0;
    auto report = ts::profiler::import::importTraces({path}, rec, options);
    if (report) {
        ts::fuzz::check(size_t(report->summary.slices) == rec.slices, "summary counts the emitted slices");
        for (const auto& [name, count] : report->stats.all()) ts::fuzz::check(ts::isValidUtf8(name), "stat name");
    } else {
        ts::fuzz::check(!report.status().message().empty(), "an error says why");
    }
    return 0;
}

#ifndef TS_LIBFUZZER
int main(int argc, char** argv) {
    return ts::fuzz::replayMain(
        argc, argv, "fuzz_kineto",
        {"{\"traceEvents\":[", "]}", "{\"ph\":\"X\",", "\"ph\":\"i\"", "\"ph\":\"M\"", "\"cat\":\"kernel\",",
         "\"cat\":\"cuda_runtime\",", "\"cat\":\"user_annotation\",", "\"name\":\"ProfilerStep#3\",",
         "\"name\":\"[memory]\",", "\"pid\":0,", "\"tid\":7,", "\"ts\":1.5,", "\"dur\":2,", "\"ts\":\"12\",",
         "\"args\":{\"stream\":7,\"device\":0,\"correlation\":5}", "\"Total Allocated\":100",
         "\"distributedInfo\":{\"rank\":1,\"world_size\":2}", "\"baseTimeNanoseconds\":1700000000000000000,",
         "\"dtype\":\"Float\",", "\"In msg nelems\":1024,", "ncclKernel_AllReduce", "\"\\ud800\"", "1e999", "-0"},
        1 << 16);
}
#endif
