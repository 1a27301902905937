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

using namespace gputest;

class CudaReview : public CudaStreamTest {};

// Exactly equal (-0 == +0; NaN never matches).
void expectEqualVec(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
    expectClose(got, want, 0, 0, what, {}, {}, /*nanMatchesNan=*/false);
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
    DeviceVec<int> gPos(qPos);
    DeviceVec<float> gq(q), gO(garbage), gdq(garbage);
    TS_ASSERT_OK(gPos.status);
    TS_ASSERT_OK(gq.status);
    TS_ASSERT_OK(gO.status);
    TS_ASSERT_OK(gdq.status);
    TS_ASSERT_OK(cuda::cpAttentionForward(a, gPos.ptr, gq.ptr, nullptr, nullptr, nullptr, gO.ptr, m_stream));
    TS_ASSERT_OK(cuda::cpAttentionBackward(a, gPos.ptr, gq.ptr, nullptr, nullptr, nullptr, gq.ptr, gdq.ptr, nullptr,
                                           nullptr, m_stream));
    sync();
    expectEqualVec(gO.download(), out, "cpAttentionForward skv=0 out");
    expectEqualVec(gdq.download(), dq, "cpAttentionBackward skv=0 dq");
}

}  // namespace
}  // namespace ts::kernels

#else  // !TS_HAVE_CUDA

TEST(CudaReview, Skipped) { GTEST_SKIP() << "built without CUDA"; }

#endif
