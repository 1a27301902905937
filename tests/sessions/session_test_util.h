// Fixtures shared by the sessions tests (agent, CLI agent, workspace): a temporary directory
// removed with its contents, and a collector of node notifications that waits for one.
#pragma once

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ts::sessions::testutil {

// mkdtemp under /tmp; `prefix` names the test file so leftovers are attributable.
struct TempDir {
    std::string path;
    explicit TempDir(const std::string& prefix = "ts_sessions_test") {
        std::string tmpl = "/tmp/" + prefix + "_XXXXXX";
        std::vector<char> buf(tmpl.begin(), tmpl.end());
        buf.push_back('\0');
        const char* p = ::mkdtemp(buf.data());
        path = p ? p : "";
    }
    ~TempDir() {
        std::error_code ec;
        if (!path.empty()) std::filesystem::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
};

// Notifications of a NodeClient / agent connection (method, params), thread-safe.
struct Events {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::pair<std::string, nlohmann::json>> all;
    void add(const std::string& m, const nlohmann::json& p) {
        std::lock_guard l(mu);
        all.emplace_back(m, p);
        cv.notify_all();
    }
    // Waits for `method` about `runId`; its params into *out. False on timeout.
    bool waitFor(const std::string& method, const std::string& runId, nlohmann::json* out, int timeoutMs = 60000) {
        std::unique_lock l(mu);
        return cv.wait_for(l, std::chrono::milliseconds(timeoutMs), [&] {
            for (auto& [m, p] : all)
                if (m == method && p.value("run_id", "") == runId) {
                    if (out) *out = p;
                    return true;
                }
            return false;
        });
    }
    int count(const std::string& method, const std::string& runId) {
        std::lock_guard l(mu);
        int n = 0;
        for (auto& [m, p] : all) n += (m == method && p.value("run_id", "") == runId);
        return n;
    }
};

}  // namespace ts::sessions::testutil
