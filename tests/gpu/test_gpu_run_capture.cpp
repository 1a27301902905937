// A training run on GPU 0 captured as `trainscope run` captures it (apps/trainscope/gpu_capture.h):
// the engine records its host side, CUPTI the GPU's kernels. Checks that the kernels land on the
// track the engine's compute stream is named by ("rank 0 compute", kind Compute), not on a
// stream-id track; that the GEMMs are there; and that the per-rank analyses see device time.
// Skips without a CUDA device; without CUPTI in the build, capture must say why.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "apps/trainscope/gpu_capture.h"
#include "engine/backend/backend.h"
#include "engine/backend/kernels.h"
#include "profiler/analysis.h"
#include "profiler/store.h"
#include "tests/trainer_backend_run.h"

namespace ts {
namespace {

TEST(GpuRunCapture, KernelsLandOnTheRanksNamedTracksAndAnalyze) {
    auto be = engine::makeCudaBackend();
    if (!be) GTEST_SKIP() << "no CUDA backend: " << be.status().message();
    auto store = profiler::TraceStore::create(":memory:");
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    profiler::TraceWriter writer(*store.value(), 1000);

    engine::Config c = testing::tinyTrainerConfig();
    c.device_backend = "cuda";
    c.train_iters = 2;
    engine::Device& dev = (*be)->device(0);
    dev.setTrace(&writer, 0);
    auto stream = dev.createStream(trace::TrackKind::Compute, "compute");
    engine::TrainerOptions o;
    o.emulateDevice = false;
    auto t = engine::Trainer::create(c, &dev, stream.get(), &writer, o);
    ASSERT_TRUE(t.isOk()) << t.status().toString();
    std::string why;
    auto capture = cli::GpuCapture::start(writer, {{0, &dev}}, &why);
#if !(defined(TS_HAVE_CUPTI) && defined(TS_HAVE_CUDA))
    ASSERT_EQ(capture, nullptr);
    EXPECT_NE(why.find("CUPTI"), std::string::npos) << why;
    GTEST_SKIP() << "this build has no CUPTI: " << why;
#endif
    ASSERT_NE(capture, nullptr) << why;
    engine::TrainerCallbacks cb;
    cb.onStep = [&](const engine::StepProgress&) { EXPECT_TRUE(capture->flush().isOk()); };
    ASSERT_TRUE((*t)->train(-1, cb).isOk());
    t->reset();
    stream.reset();
    dev.setTrace(nullptr, 0);
    ASSERT_TRUE(capture->stop().isOk());
    ASSERT_TRUE(writer.finish().isOk());

    profiler::TraceStore& st = *store.value();
    auto tracks = st.tracks();
    auto strings = st.strings();
    ASSERT_TRUE(tracks.isOk() && strings.isOk());
    std::map<uint32_t, profiler::TrackRow> byId;
    for (const auto& tr : tracks.value()) byId[tr.id] = tr;
    std::map<std::string, int> kernelsOnTrack;
    std::set<trace::Category> categories;
    ASSERT_TRUE(st.forEachSlice({}, [&](const trace::Slice& s) {
                      const profiler::TrackRow& tr = byId[s.track];
                      if (tr.kind != trace::TrackKind::HostThread) {
                          ++kernelsOnTrack[tr.name];
                          categories.insert(s.category);
                      }
                      return true;
                  }).isOk());
    std::string seen;
    for (const auto& [name, n] : kernelsOnTrack) seen += name + " (" + std::to_string(n) + ") ";
    ASSERT_GT(kernelsOnTrack["rank 0 compute"], 0) << "device tracks: " << seen;
    EXPECT_TRUE(categories.count(trace::Category::Gemm)) << "no GEMM kernel captured; tracks: " << seen;
    auto tb = profiler::temporalBreakdown(st, 0);
    ASSERT_TRUE(tb.isOk()) << tb.status().toString();
    EXPECT_GT(tb->computeNs, 0);
    auto kb = profiler::kernelBreakdown(st, 0);
    ASSERT_TRUE(kb.isOk()) << kb.status().toString();
    EXPECT_GT(kb->totalNs, 0);
    std::printf("[gpu capture] device tracks: %s; compute %.3f ms of a %.3f ms window\n", seen.c_str(),
                tb->computeNs / 1e6, tb->kernelTimeNs / 1e6);
}

// Ranks sharing one GPU (cuda_share_gpus): CUPTI sees one device, so each engine stream's label
// carries the rank its device traces for, and each rank's kernels land on its own tracks, the
// zero-fill memsets of allocate() on its "alloc" track.
TEST(GpuRunCapture, RanksSharingAGpuGetTheirOwnTracks) {
    auto be = engine::makeSharedCudaBackend(2);
    if (!be) GTEST_SKIP() << "no CUDA backend: " << be.status().message();
    auto store = profiler::TraceStore::create(":memory:");
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    profiler::TraceWriter writer(*store.value(), 1000);
    std::vector<engine::Device*> devs = {&(*be)->device(0), &(*be)->device(1)};
    for (int r = 0; r < 2; ++r) devs[size_t(r)]->setTrace(&writer, r);
    std::string why;
    auto capture = cli::GpuCapture::start(writer, {{0, devs[0]}, {1, devs[1]}}, &why);
#if !(defined(TS_HAVE_CUPTI) && defined(TS_HAVE_CUDA))
    ASSERT_EQ(capture, nullptr);
    GTEST_SKIP() << "this build has no CUPTI: " << why;
#endif
    ASSERT_NE(capture, nullptr) << why;
    {
        const int64_t n = 1 << 16;
        std::vector<std::unique_ptr<engine::Stream>> streams;
        std::vector<std::unique_ptr<engine::Buffer>> bufs;
        for (int r = 0; r < 2; ++r) {
            streams.push_back(devs[size_t(r)]->createStream(trace::TrackKind::Compute, "compute"));
            auto b = devs[size_t(r)]->allocate(size_t(n) * 4, engine::MemCategory::Activations);
            ASSERT_TRUE(b.isOk()) << b.status().toString();
            bufs.push_back(std::move(*b));
        }
        for (int r = 0; r < 2; ++r) {
            float* x = bufs[size_t(r)]->as<float>();
            for (int k = 0; k < 1 + r; ++k)  // rank 0 runs one kernel, rank 1 two
                streams[size_t(r)]->submit(engine::OpDesc{"add"}, [x, n] {
                    engine::kern::add(x, x, x, n);
                    return Status::ok();
                });
            ASSERT_TRUE(streams[size_t(r)]->synchronize().isOk());
        }
        ASSERT_TRUE(capture->flush().isOk());
    }
    for (auto* d : devs) d->setTrace(nullptr, 0);
    ASSERT_TRUE(capture->stop().isOk());
    ASSERT_TRUE(writer.finish().isOk());

    profiler::TraceStore& st = *store.value();
    auto tracks = st.tracks();
    ASSERT_TRUE(tracks.isOk());
    std::map<uint32_t, profiler::TrackRow> byId;
    for (const auto& tr : tracks.value()) byId[tr.id] = tr;
    std::map<std::string, int> onTrack;
    std::map<std::string, int> rankOf;
    ASSERT_TRUE(st.forEachSlice({}, [&](const trace::Slice& s) {
                      const profiler::TrackRow& tr = byId[s.track];
                      if (tr.kind != trace::TrackKind::HostThread) {
                          ++onTrack[tr.name];
                          rankOf[tr.name] = tr.rank;
                      }
                      return true;
                  }).isOk());
    std::string seen;
    for (const auto& [name, k] : onTrack) seen += name + " (" + std::to_string(k) + ") ";
    EXPECT_GE(onTrack["rank 0 compute"], 1) << "device tracks: " << seen;
    EXPECT_EQ(onTrack["rank 1 compute"], 2 * onTrack["rank 0 compute"]) << "device tracks: " << seen;
    EXPECT_EQ(rankOf["rank 1 compute"], 1) << "device tracks: " << seen;
    EXPECT_GT(onTrack["rank 0 alloc"], 0) << "device tracks: " << seen;
    EXPECT_GT(onTrack["rank 1 alloc"], 0) << "device tracks: " << seen;
    std::printf("[gpu capture] two ranks on one GPU: %s\n", seen.c_str());
}

}  // namespace
}  // namespace ts
