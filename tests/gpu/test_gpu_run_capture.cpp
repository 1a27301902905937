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

}  // namespace
}  // namespace ts
