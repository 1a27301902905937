// A Recorder that keeps everything in memory, for tests of the trace hooks.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/recorder.h"

namespace ts::test {

class FakeRecorder : public trace::Recorder {
public:
    uint32_t track(const trace::TrackDesc& desc) override {
        std::lock_guard<std::mutex> lock(m_mutex);
        tracks.push_back(desc);
        return uint32_t(tracks.size());  // 1-based so 0 stays "none"
    }
    uint32_t intern(std::string_view text) override {
        std::lock_guard<std::mutex> lock(m_mutex);
        auto it = m_ids.find(std::string(text));
        if (it != m_ids.end()) return it->second;
        strings.emplace_back(text);
        const auto id = uint32_t(strings.size());
        m_ids.emplace(std::string(text), id);
        return id;
    }
    void slice(const trace::Slice& s) override {
        std::lock_guard<std::mutex> lock(m_mutex);
        slices.push_back(s);
    }
    void counter(const trace::Counter& c) override {
        std::lock_guard<std::mutex> lock(m_mutex);
        counters.push_back(c);
    }
    void metadata(std::string_view, std::string_view) override {}
    uint64_t nextCorrelation() override { return ++m_corr; }

    // Test-side accessors (call when no thread records any more).
    std::string str(uint32_t id) const { return id == 0 ? std::string() : strings.at(id - 1); }
    const trace::TrackDesc& trackDesc(uint32_t id) const { return tracks.at(id - 1); }

    std::vector<trace::TrackDesc> tracks;
    std::vector<std::string> strings;
    std::vector<trace::Slice> slices;
    std::vector<trace::Counter> counters;

private:
    std::mutex m_mutex;
    std::map<std::string, uint32_t> m_ids;
    std::atomic<uint64_t> m_corr{0};
};

}  // namespace ts::test
