// Shared by the importer fuzz targets: a Recorder that checks what the importers emit (every
// string valid UTF-8, every slice on a track it was given, metadata writable as JSON) and a
// scratch file the input is written to (the importers read paths).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/fuzz/replay_main.h"
#include "common/recorder.h"
#include "common/text.h"

namespace ts::fuzz {

class CheckingRecorder : public trace::Recorder {
public:
    uint32_t track(const trace::TrackDesc& d) override {
        check(isValidUtf8(d.name), "track name is UTF-8");
        return ++m_tracks;
    }
    uint32_t intern(std::string_view text) override {
        check(isValidUtf8(text), "interned string is UTF-8");
        return ++m_strings;
    }
    void slice(const trace::Slice& s) override {
        check(s.track >= 1 && s.track <= m_tracks, "slice on a known track");
        check(s.name <= m_strings && s.group <= m_strings, "slice names are interned ids");
        ++slices;
    }
    void counter(const trace::Counter& c) override {
        check(c.name <= m_strings, "counter name is an interned id");
        ++counters;
    }
    void metadata(std::string_view key, std::string_view value) override {
        check(isValidUtf8(key) && isValidUtf8(value), "metadata is UTF-8");
        try {
            (void)nlohmann::json(std::string(value)).dump();
        } catch (const std::exception&) {
            check(false, "metadata dumps as JSON");
        }
    }
    uint64_t nextCorrelation() override { return ++m_correlation; }

    size_t slices = 0, counters = 0;

private:
    uint32_t m_tracks = 0, m_strings = 0;
    uint64_t m_correlation = 0;
};

// One scratch file per process (the importers take a path); removed at exit.
inline const std::string& scratchPath(const char* suffix) {
    static std::string path = [&] {
        const char* tmp = std::getenv("TMPDIR");
        std::string p = std::string(tmp && *tmp ? tmp : "/tmp") + "/ts_fuzz_" + std::to_string(::getpid()) + suffix;
        std::atexit([] { std::remove(path.c_str()); });
        return p;
    }();
    return path;
}

inline void writeScratch(const std::string& path, const void* data, size_t size) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    check(f != nullptr, "scratch file can be written");
    if (size) check(std::fwrite(data, 1, size, f) == size, "scratch file write");
    std::fclose(f);
}

}  // namespace ts::fuzz
