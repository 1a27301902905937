// Fuzz target for the node protocol's message parser (sessions/jsonrpc.h): LSP-style framing
// plus JSON-RPC classification must survive any byte stream without crashing, hanging or
// buffering without bound.
//
// Two builds of this one file:
//   libFuzzer (clang):  configure with -DCMAKE_CXX_COMPILER=clang++ -DTS_ENABLE_FUZZ=ON, or by hand:
//     clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -DTS_LIBFUZZER -I.
//             apps/fuzz/fuzz_jsonrpc.cpp sessions/jsonrpc.cpp -o fuzz_jsonrpc   (one line)
//     ./fuzz_jsonrpc -max_total_time=60 apps/fuzz/corpus
//   replay (any compiler, built by default as fuzz_jsonrpc_replay): runs every file or folder
//   given on the command line through the same entry point, then a fixed number of seeded
//   random mutations of them, so the corpus is exercised without clang.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "sessions/jsonrpc.h"

using namespace ts::sessions::rpc;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    // The first byte picks the chunking so the reader also sees messages split at every point.
    size_t chunk = size ? (size_t(data[0]) % 17) + 1 : 1;
    FrameReader reader(/*maxMessageBytes=*/4096);
    for (size_t off = 0; off < size; off += chunk) {
        reader.feed(reinterpret_cast<const char*>(data) + off, std::min(chunk, size - off));
        for (;;) {
            FrameEvent ev = reader.next();
            if (ev.kind == FrameEvent::Kind::None) break;
            if (ev.kind == FrameEvent::Kind::Message) {
                for (const Message& m : parseMessages(ev.body)) {
                    // Build the reply the agent would send; it must always serialise.
                    nlohmann::json reply = m.kind == Message::Kind::Invalid
                                               ? makeError(m.id, m.errorCode, m.errorMessage)
                                               : makeResult(m.id, m.params);
                    (void)encodeFrame(reply);
                }
            }
        }
        // Invariant: never more buffered than one header block + one allowed body + one chunk.
        if (reader.bufferedBytes() > kMaxHeaderBytes + 4 + 4096 + chunk) __builtin_trap();
    }
    // The body parser alone, on the raw input.
    (void)parseMessages(std::string_view(reinterpret_cast<const char*>(data), size));
    std::string decoded;
    (void)base64Decode(std::string_view(reinterpret_cast<const char*>(data), size), &decoded);
    return 0;
}

#ifndef TS_LIBFUZZER
int main(int argc, char** argv) {
    namespace fs = std::filesystem;
    std::vector<std::string> inputs;
    for (int i = 1; i < argc; ++i) {
        std::error_code ec;
        if (fs::is_directory(argv[i], ec)) {
            for (const auto& e : fs::directory_iterator(argv[i], ec))
                if (e.is_regular_file()) inputs.push_back(e.path().string());
        } else {
            inputs.push_back(argv[i]);
        }
    }
    std::vector<std::string> corpus;
    for (const auto& p : inputs) {
        std::ifstream f(p, std::ios::binary);
        std::stringstream ss;
        ss << f.rdbuf();
        corpus.push_back(ss.str());
    }
    if (corpus.empty()) corpus.push_back(encodeFrame(makeRequest(1, "hello")));
    size_t runs = 0;
    for (const auto& c : corpus) {
        LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(c.data()), c.size());
        ++runs;
    }
    // Seeded mutations: flips, inserts, deletes, splices between corpus entries.
    std::mt19937 rng(12345);
    const int kMutations = 20000;
    for (int i = 0; i < kMutations; ++i) {
        std::string s = corpus[rng() % corpus.size()];
        int edits = 1 + int(rng() % 8);
        for (int e = 0; e < edits; ++e) {
            size_t pos = s.empty() ? 0 : rng() % s.size();
            switch (rng() % 4) {
                case 0: if (!s.empty()) s[pos] = char(rng()); break;
                case 1: s.insert(pos, 1, char(rng())); break;
                case 2: if (!s.empty()) s.erase(pos, 1 + rng() % 8); break;
                case 3: s += corpus[rng() % corpus.size()]; break;
            }
        }
        LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
        ++runs;
    }
    std::printf("fuzz_jsonrpc_replay: %zu inputs ran without a crash\n", runs);
    return 0;
}
#endif
