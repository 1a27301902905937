// Edge cases found by the review of kernels/cuda (no GPU had run them): the context-parallel
// all-gather attention against an empty key set (skv = 0), where the CPU oracle overwrites out
// and dq with zeros and the CUDA engine used to return without writing them. Skips without a
// CUDA build or device.
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"

#ifdef TS_HAVE_CUDA

#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops_cuda.h"

#include <string>
#include <vector>

namespace ts::kernels {
namespace {

class CudaReview : public ::testing::Test {
protected:
    void SetUp() override {
        int count = 0;
        const Status s = cuda::deviceCount(&count);
        if (!s.isOk() || count == 0)
            GTEST_SKIP() << "no CUDA device available (" << (s.isOk() ? "0 devices" : s.toString()) << ")";
        TS_ASSERT_OK(cuda::streamCreate(&m_stream));
    }
    void TearDown() override {
        if (m_stream) (void)cuda::streamDestroy(m_stream);
    }
    void* m_stream = nullptr;
};

// A device copy of `host` (freed by the caller through deviceFree).
template <typename T>
T* upload(const std::vector<T>& host) {
    void* p = nullptr;
    if (!cuda::deviceAlloc(&p, sizeof(T) * (host.empty() ? 1 : host.size())).isOk()) return nullptr;
    if (!host.empty() && !cuda::copyToDevice(p, host.data(), sizeof(T) * host.size()).isOk()) return nullptr;
    return static_cast<T*>(p);
}

std::vector<float> download(const float* d, size_t n) {
    std::vector<float> h(n);
    const Status s = cuda::copyToHost(h.data(), d, sizeof(float) * n);
    EXPECT_TRUE(s.isOk()) << s.toString();
    return h;
}

void expectEqualVec(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
        if (got[i] != want[i] && ++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: gpu " << got[i] << " cpu " << want[i];
    EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements differ";
}

TEST_F(CudaReview, CpAttentionWithNoKeysZeroesOutAndDq) {
    cpu::CpAttnDims a;
    a.sq = 3;
    a.skv = 0;
    a.b = 2;
    a.nq = 4;
    a.nkv = 2;
    a.d = 8;
    a.scale = 0.25f;
    const std::vector<int> qPos{0, 1, 2};
    const size_t nQ = size_t(a.sq) * a.b * a.nq * a.d;
    const std::vector<float> q(nQ, 0.5f), garbage(nQ, 7.0f);
    std::vector<float> out(nQ, 7.0f), dq(nQ, 7.0f);
    cpu::cpAttentionForward(a, qPos.data(), q.data(), nullptr, nullptr, nullptr, out.data());
    cpu::cpAttentionBackward(a, qPos.data(), q.data(), nullptr, nullptr, nullptr, q.data(), dq.data(), nullptr,
                             nullptr);
    int* gPos = upload(qPos);
    float* gq = upload(q);
    float* gO = upload(garbage);
    float* gdq = upload(garbage);
    ASSERT_TRUE(gPos && gq && gO && gdq);
    TS_ASSERT_OK(cuda::cpAttentionForward(a, gPos, gq, nullptr, nullptr, nullptr, gO, m_stream));
    TS_ASSERT_OK(cuda::cpAttentionBackward(a, gPos, gq, nullptr, nullptr, nullptr, gq, gdq, nullptr, nullptr,
                                           m_stream));
    TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
    expectEqualVec(download(gO, nQ), out, "cpAttentionForward skv=0 out");
    expectEqualVec(download(gdq, nQ), dq, "cpAttentionBackward skv=0 dq");
    for (void* p : {static_cast<void*>(gPos), static_cast<void*>(gq), static_cast<void*>(gO), static_cast<void*>(gdq)})
        (void)cuda::deviceFree(p);
}

}  // namespace
}  // namespace ts::kernels

#else  // !TS_HAVE_CUDA

TEST(CudaReview, Skipped) { GTEST_SKIP() << "built without CUDA"; }

#endif
