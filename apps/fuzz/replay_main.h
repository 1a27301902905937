// main() of the fuzz replay programs (the builds without libFuzzer): every corpus file given
// on the command line (files or folders) goes through LLVMFuzzerTestOneInput, then seeded
// random mutations of them (byte flips, inserts, deletes, splices, dictionary tokens) until
// --seconds or --runs is reached. CTest runs each for a few seconds; run it longer by hand:
//   fuzz_X_replay --seconds 600 apps/fuzz/corpus/X
// A crash aborts the program (CTest fails); a signal handler first writes the input that
// caused it to crash-<name>.bin in the working directory.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace ts::fuzz {

namespace detail {
inline const std::string* g_current = nullptr;
inline char g_crashPath[256] = "crash.bin";
inline void onCrash(int sig) {
    if (g_current) {
        const int fd = ::open(g_crashPath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            (void)!::write(fd, g_current->data(), g_current->size());
            ::close(fd);
        }
    }
    ::signal(sig, SIG_DFL);
    ::raise(sig);
}
}  // namespace detail

inline int replayMain(int argc, char** argv, const char* name, const std::vector<std::string>& dictionary,
                      size_t maxLen = 1 << 16) {
    namespace fs = std::filesystem;
    double seconds = 5;
    uint64_t maxRuns = UINT64_MAX;
    uint32_t seed = 12345;
    std::vector<std::string> inputs;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--seconds" && i + 1 < argc) seconds = std::atof(argv[++i]);
        else if (a == "--runs" && i + 1 < argc) maxRuns = std::strtoull(argv[++i], nullptr, 10);
        else if (a == "--seed" && i + 1 < argc) seed = uint32_t(std::strtoul(argv[++i], nullptr, 10));
        else if (fs::is_directory(a))
            for (const auto& e : fs::directory_iterator(a)) {
                if (e.is_regular_file()) inputs.push_back(e.path().string());
            }
        else inputs.push_back(a);
    }
    std::vector<std::string> corpus;
    for (const auto& p : inputs) {
        std::ifstream f(p, std::ios::binary);
        std::stringstream ss;
        ss << f.rdbuf();
        corpus.push_back(ss.str());
    }
    if (corpus.empty()) corpus.push_back("");
    std::string current;
    detail::g_current = &current;
    std::snprintf(detail::g_crashPath, sizeof detail::g_crashPath, "crash-%s.bin", name);
    for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) ::signal(sig, detail::onCrash);
    auto runOne = [&](const std::string& s) {
        current = s;
        LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    };
    const auto start = std::chrono::steady_clock::now();
    uint64_t runs = 0;
    for (const auto& c : corpus) {
        runOne(c);
        ++runs;
    }
    std::mt19937 rng(seed);
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    while (runs < maxRuns && elapsed() < seconds) {
        std::string s = corpus[rng() % corpus.size()];
        const int edits = 1 + int(rng() % 8);
        for (int e = 0; e < edits; ++e) {
            const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
            switch (rng() % 7) {
                case 0:
                    if (!s.empty()) s[pos % s.size()] = char(rng());
                    break;
                case 1: s.insert(pos, 1, char(rng())); break;
                case 2:
                    if (!s.empty()) s.erase(pos % s.size(), 1 + rng() % 16);
                    break;
                case 3: {
                    const std::string& o = corpus[rng() % corpus.size()];
                    if (!o.empty()) {
                        const size_t from = rng() % o.size();
                        s.insert(pos, o.substr(from, 1 + rng() % 64));
                    }
                    break;
                }
                case 4:
                    if (!dictionary.empty()) s.insert(pos, dictionary[rng() % dictionary.size()]);
                    break;
                case 5:  // duplicate a span (repetition finds size and nesting bugs)
                    if (!s.empty()) {
                        const size_t from = rng() % s.size();
                        const std::string span = s.substr(from, 1 + rng() % 32);
                        for (int k = int(rng() % 8); k >= 0; --k) s.insert(pos, span);
                    }
                    break;
                case 6:  // interesting bytes
                    if (!s.empty()) {
                        static const char kBytes[] = {'\0', '\xff', '\x80', '\x7f', '\xc0', '\xed', '\x1b', '"', '\\'};
                        s[pos % s.size()] = kBytes[rng() % sizeof kBytes];
                    }
                    break;
            }
        }
        if (s.size() > maxLen) s.resize(maxLen);
        runOne(s);
        ++runs;
    }
    std::printf("%s: %llu inputs (%zu corpus files, then mutations) in %.1f s without a crash\n", name,
                static_cast<unsigned long long>(runs), corpus.size(), elapsed());
    return 0;
}

// Traps (a crash the fuzzer reports) when an invariant does not hold.
inline void check(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
        std::abort();
    }
}

}  // namespace ts::fuzz
