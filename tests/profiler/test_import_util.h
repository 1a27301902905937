// Helpers for the importer tests: a Recorder that keeps every row in memory, so parsers are
// tested without a database, and small file utilities.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include <zlib.h>

#include "common/recorder.h"

namespace ts::profiler::import::testing {

class CollectingRecorder : public trace::Recorder {
public:
    CollectingRecorder() { strings.emplace_back(); }
    uint32_t track(const trace::TrackDesc& d) override {
        tracks.push_back(d);
        return static_cast<uint32_t>(tracks.size() - 1);
    }
    uint32_t intern(std::string_view text) override {
        if (text.empty()) return 0;
        auto it = ids.find(std::string(text));
        if (it != ids.end()) return it->second;
        auto id = static_cast<uint32_t>(strings.size());
        strings.emplace_back(text);
        ids.emplace(std::string(text), id);
        return id;
    }
    void slice(const trace::Slice& s) override { slices.push_back(s); }
    void counter(const trace::Counter& c) override { counters.push_back(c); }
    void metadata(std::string_view key, std::string_view value) override { meta[std::string(key)] = std::string(value); }
    uint64_t nextCorrelation() override { return ++lastCorrelation; }

    const std::string& name(const trace::Slice& s) const { return strings.at(s.name); }
    const trace::TrackDesc& trackOf(const trace::Slice& s) const { return tracks.at(s.track); }
    bool onDevice(const trace::Slice& s) const { return trackOf(s).kind != trace::TrackKind::HostThread; }

    std::vector<trace::TrackDesc> tracks;
    std::vector<std::string> strings;
    std::unordered_map<std::string, uint32_t> ids;
    std::vector<trace::Slice> slices;
    std::vector<trace::Counter> counters;
    std::map<std::string, std::string> meta;
    uint64_t lastCorrelation = 0;
};

inline std::string testdata(const std::string& rel) { return std::string(TS_SHARED_TESTDATA) + "/" + rel; }

// A fresh directory under the build tree for files a test writes.
inline std::filesystem::path scratchDir(const std::string& name) {
    auto dir = std::filesystem::path(TS_BINARY_DIR) / "test_scratch" / name;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
}

inline void writeFile(const std::filesystem::path& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary);
    out << bytes;
}

inline std::string readFile(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// Whole decompressed content of a gzip file (test-side reference reader, not the importer's).
inline std::string gunzipFile(const std::string& path) {
    gzFile gz = gzopen(path.c_str(), "rb");
    std::string out;
    if (!gz) return out;
    char buf[1 << 16];
    int n = 0;
    while ((n = gzread(gz, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    gzclose(gz);
    return out;
}

inline void gzipWrite(const std::filesystem::path& p, const std::string& bytes) {
    gzFile gz = gzopen(p.string().c_str(), "wb");
    gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(gz);
}

}  // namespace ts::profiler::import::testing
