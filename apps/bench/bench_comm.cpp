// In-process communicator bandwidth per collective, size and rank count, reported as nccl-tests
// does: time = mean wall time of one op (all ranks enqueue, all streams synchronized),
// algBw = size / time, busBw = algBw * busBwFactor (engine/comm/communicator.h), in GB/s (1e9).
// "size" is nccl-tests' size column: the full buffer for allReduce/broadcast, the total
// (count * ranks) for reduceScatter/allGather, the bytes each rank sends for allToAll.
//
// Usage: bench_comm [--ranks 2,4,8] [--max-bytes N] [--min-time-ms T] [--ops all_reduce,...]
// Prints a table and one JSON line {"bench":"comm", "results":[...]}.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/backend/backend.h"
#include "engine/comm/inproc_communicator.h"

using namespace ts;
using namespace ts::engine;

namespace {

std::vector<int> parseList(const std::string& s) {
    std::vector<int> out;
    std::stringstream ss(s);
    std::string tok;
    while (std::getline(ss, tok, ',')) out.push_back(std::atoi(tok.c_str()));
    return out;
}

std::vector<std::string> parseNames(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string tok;
    while (std::getline(ss, tok, ',')) out.push_back(tok);
    return out;
}

struct BenchResult {
    std::string op;
    int ranks = 0;
    size_t bytes = 0;
    int iters = 0;
    double usPerOp = 0, algBw = 0, busBw = 0;
};

}  // namespace

int main(int argc, char** argv) {
    std::vector<int> rankCounts = {2, 4, 8};
    size_t maxBytes = size_t(64) << 20;
    double minTimeMs = 100;
    std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"};
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
        if (a == "--ranks") rankCounts = parseList(next());
        else if (a == "--max-bytes") maxBytes = size_t(std::atoll(next().c_str()));
        else if (a == "--min-time-ms") minTimeMs = std::atof(next().c_str());
        else if (a == "--ops") ops = parseNames(next());
        else {
            std::fprintf(stderr, "usage: bench_comm [--ranks 2,4,8] [--max-bytes N] [--min-time-ms T] [--ops LIST]\n");
            return 2;
        }
    }

    std::vector<BenchResult> results;
    std::printf("%-15s %5s %12s %7s %12s %10s %10s\n", "op", "ranks", "size(B)", "iters", "time(us)", "algBw", "busBw");
    for (int n : rankCounts) {
        CommWorld world(n);
        auto backend = makeCpuBackend(n);
        std::vector<std::unique_ptr<Stream>> streams;
        std::vector<std::unique_ptr<Communicator>> comms;
        std::vector<int> members(static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) members[size_t(r)] = r;
        for (int r = 0; r < n; ++r) {
            streams.push_back(backend->device(r).createStream(trace::TrackKind::Comm, "comm"));
            auto c = world.join("world", members, r);
            if (!c.isOk()) {
                std::fprintf(stderr, "%s\n", c.status().toString().c_str());
                return 1;
            }
            comms.push_back(std::move(c).value());
        }
        for (const std::string& opName : ops) {
            std::vector<size_t> sizes;
            for (size_t b = 8; b <= maxBytes; b *= 8) sizes.push_back(b);
            if (sizes.empty() || sizes.back() != maxBytes) sizes.push_back(maxBytes);
            for (size_t bytes : sizes) {
                // f32 elements; "size" per nccl-tests (see header).
                const size_t count = std::max<size_t>(1, bytes / 4);
                const size_t perRank = std::max<size_t>(1, count / size_t(n));
                CollectiveKind kind = CollectiveKind::AllReduce;
                size_t sendElems = count, recvElems = count;
                if (opName == "reduce_scatter") { kind = CollectiveKind::ReduceScatter; sendElems = perRank * size_t(n); recvElems = perRank; }
                else if (opName == "all_gather") { kind = CollectiveKind::AllGather; sendElems = perRank; recvElems = perRank * size_t(n); }
                else if (opName == "broadcast") { kind = CollectiveKind::Broadcast; }
                else if (opName == "all_to_all") { kind = CollectiveKind::AllToAll; sendElems = recvElems = perRank * size_t(n); }
                else if (opName != "all_reduce") {
                    std::fprintf(stderr, "unknown op %s\n", opName.c_str());
                    return 2;
                }
                const size_t sizeBytes = (kind == CollectiveKind::AllReduce || kind == CollectiveKind::Broadcast)
                                             ? count * 4
                                             : perRank * size_t(n) * 4;
                std::vector<std::vector<float>> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
                for (int r = 0; r < n; ++r) {
                    send[size_t(r)].assign(sendElems, float(r + 1));
                    recv[size_t(r)].assign(recvElems, 0.0f);
                }
                const std::vector<size_t> counts(size_t(n), perRank);
                auto enqueueAll = [&] {
                    for (int r = 0; r < n; ++r) {
                        Communicator& c = *comms[size_t(r)];
                        Stream& s = *streams[size_t(r)];
                        float* in = send[size_t(r)].data();
                        float* out = recv[size_t(r)].data();
                        switch (kind) {
                            case CollectiveKind::AllReduce: c.allReduce(s, in, out, count, DType::F32, ReduceOp::Sum); break;
                            case CollectiveKind::ReduceScatter: c.reduceScatter(s, in, out, perRank, DType::F32, ReduceOp::Sum); break;
                            case CollectiveKind::AllGather: c.allGather(s, in, out, perRank, DType::F32); break;
                            case CollectiveKind::Broadcast: c.broadcast(s, in, count, DType::F32, 0); break;
                            case CollectiveKind::AllToAll: c.allToAllv(s, in, counts, out, counts, DType::F32); break;
                            default: break;
                        }
                    }
                };
                auto syncAll = [&]() -> bool {
                    bool ok = true;
                    for (auto& s : streams) {
                        Status st = s->synchronize();
                        if (!st.isOk()) {
                            std::fprintf(stderr, "%s\n", st.toString().c_str());
                            ok = false;
                        }
                    }
                    return ok;
                };
                enqueueAll();  // warm-up (page faults, thread wake-up)
                if (!syncAll()) return 1;
                int iters = 0;
                const auto t0 = std::chrono::steady_clock::now();
                double elapsedMs = 0;
                // Batches of ops in flight, as a training step issues them.
                while (elapsedMs < minTimeMs || iters < 3) {
                    for (int k = 0; k < 4; ++k) enqueueAll();
                    if (!syncAll()) return 1;
                    iters += 4;
                    elapsedMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
                }
                BenchResult res;
                res.op = opName;
                res.ranks = n;
                res.bytes = sizeBytes;
                res.iters = iters;
                res.usPerOp = elapsedMs * 1000.0 / iters;
                res.algBw = double(sizeBytes) / (res.usPerOp * 1e-6) / 1e9;
                res.busBw = res.algBw * busBwFactor(kind, n);
                std::printf("%-15s %5d %12zu %7d %12.2f %10.3f %10.3f\n", res.op.c_str(), n, res.bytes, res.iters,
                            res.usPerOp, res.algBw, res.busBw);
                std::fflush(stdout);
                results.push_back(res);
            }
        }
        streams.clear();
    }
    nlohmann::json j;
    j["bench"] = "comm";
    j["units"] = {{"time", "us"}, {"bw", "GB/s (1e9 B/s)"}};
    j["results"] = nlohmann::json::array();
    for (const auto& r : results)
        j["results"].push_back({{"op", r.op}, {"ranks", r.ranks}, {"bytes", r.bytes}, {"iters", r.iters},
                                {"time_us", r.usPerOp}, {"alg_bw", r.algBw}, {"bus_bw", r.busBw}});
    std::printf("%s\n", j.dump().c_str());
    return 0;
}
