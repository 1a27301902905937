// The QKV layout copies (splitQkv, mergeQkv) and the same fused with RoPE (splitQkvRopeForward,
// ropeBackwardMergeQkv) against a naive split/merge written here, plus the in-place rope kernels
// (themselves checked against the definition in test_norm_rope.cpp): equal bit for bit, for GQA
// and MHA, even and odd d.
#include "kernel_test_util.h"
#include "kernels/cpu/ops.h"

#include <cstring>

namespace ts::kernels::cpu {
namespace {

using testing::randomVector;

struct Shape {
    int s, b, nq, ng, d;
};

// qkv token layout: per group g, its r = nq/ng query heads, then k, then v (d floats each)
int64_t qkvIndex(const Shape& sh, int64_t t, int g, int slot, int i) {
    const int r = sh.nq / sh.ng;
    return ((t * sh.ng + g) * (r + 2) + slot) * sh.d + i;
}

void expectBitEqual(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what;
}

// Element by element: q/k/v from qkv (merge=false) or qkv from q/k/v (merge=true).
void naiveLayout(const Shape& sh, float* qkv, float* q, float* k, float* v, bool merge) {
    const int r = sh.nq / sh.ng;
    const int64_t T = int64_t(sh.s) * sh.b;
    auto move = [merge](float* slot, float* head) { merge ? void(*slot = *head) : void(*head = *slot); };
    for (int64_t t = 0; t < T; ++t)
        for (int g = 0; g < sh.ng; ++g)
            for (int i = 0; i < sh.d; ++i) {
                for (int j = 0; j < r; ++j) move(&qkv[qkvIndex(sh, t, g, j, i)], &q[((t * sh.nq) + g * r + j) * sh.d + i]);
                move(&qkv[qkvIndex(sh, t, g, r, i)], &k[(t * sh.ng + g) * sh.d + i]);
                move(&qkv[qkvIndex(sh, t, g, r + 1, i)], &v[(t * sh.ng + g) * sh.d + i]);
            }
}

class QkvRope : public ::testing::TestWithParam<Shape> {};

TEST_P(QkvRope, SplitAndMergeEqualTheNaiveLayoutCopies) {
    const Shape sh = GetParam();
    const int r = sh.nq / sh.ng;
    const int T = sh.s * sh.b;
    auto qkv = randomVector(size_t(T) * sh.ng * (r + 2) * sh.d, 311);
    std::vector<float> q(size_t(T) * sh.nq * sh.d), k(size_t(T) * sh.ng * sh.d), v(k.size());
    naiveLayout(sh, qkv.data(), q.data(), k.data(), v.data(), false);
    std::vector<float> q2(q.size(), -1.0f), k2(k.size(), -1.0f), v2(v.size(), -1.0f);
    splitQkv(qkv.data(), q2.data(), k2.data(), v2.data(), T, sh.nq, sh.ng, sh.d);
    expectBitEqual(q2, q, "q");
    expectBitEqual(k2, k, "k");
    expectBitEqual(v2, v, "v");

    auto dq = randomVector(q.size(), 312), dk = randomVector(k.size(), 313), dv = randomVector(v.size(), 314);
    std::vector<float> want(qkv.size(), -2.0f), got(qkv.size(), -1.0f);
    naiveLayout(sh, want.data(), dq.data(), dk.data(), dv.data(), true);
    mergeQkv(dq.data(), dk.data(), dv.data(), got.data(), T, sh.nq, sh.ng, sh.d);
    expectBitEqual(got, want, "dqkv");
}

TEST_P(QkvRope, SplitRopeEqualsSplitThenRopeAndMergeEqualsRopeBackThenMerge) {
    const Shape sh = GetParam();
    const int r = sh.nq / sh.ng;
    const int64_t T = int64_t(sh.s) * sh.b;
    const float theta = 10000.0f;
    const int posOffset = 3;
    const auto qkv = randomVector(size_t(T) * sh.ng * (r + 2) * sh.d, 301);
    // reference forward: naive split, then in-place rope on q and k
    std::vector<float> q(size_t(T) * sh.nq * sh.d), k(size_t(T) * sh.ng * sh.d), v(k.size());
    for (int64_t t = 0; t < T; ++t)
        for (int g = 0; g < sh.ng; ++g)
            for (int i = 0; i < sh.d; ++i) {
                for (int j = 0; j < r; ++j)
                    q[((t * sh.nq) + g * r + j) * sh.d + i] = qkv[size_t(qkvIndex(sh, t, g, j, i))];
                k[(t * sh.ng + g) * sh.d + i] = qkv[size_t(qkvIndex(sh, t, g, r, i))];
                v[(t * sh.ng + g) * sh.d + i] = qkv[size_t(qkvIndex(sh, t, g, r + 1, i))];
            }
    ropeForwardFused(q.data(), sh.s, sh.b, sh.nq, sh.d, theta, posOffset);
    ropeForwardFused(k.data(), sh.s, sh.b, sh.ng, sh.d, theta, posOffset);
    std::vector<float> q2(q.size(), -1.0f), k2(k.size(), -1.0f), v2(v.size(), -1.0f);
    splitQkvRopeForward(qkv.data(), q2.data(), k2.data(), v2.data(), sh.s, sh.b, sh.nq, sh.ng,
                        sh.d, theta, posOffset);
    expectBitEqual(q2, q, "q");
    expectBitEqual(k2, k, "k");
    expectBitEqual(v2, v, "v");
    // roundBf16: q and k as roundToBf16 leaves them after the call, v as copied
    std::vector<float> q3(q.size(), -1.0f), k3(k.size(), -1.0f), v3(v.size(), -1.0f);
    splitQkvRopeForward(qkv.data(), q3.data(), k3.data(), v3.data(), sh.s, sh.b, sh.nq, sh.ng, sh.d, theta,
                        posOffset, true);
    std::vector<float> qr = q, kr = k;
    roundToBf16(qr.data(), int64_t(qr.size()));
    roundToBf16(kr.data(), int64_t(kr.size()));
    ASSERT_NE(qr, q);  // the rounding changes something to look at
    expectBitEqual(q3, qr, "q bf16");
    expectBitEqual(k3, kr, "k bf16");
    expectBitEqual(v3, v, "v (bf16 run)");

    // reference backward: in-place inverse rope on dq, dk, then naive merge
    auto dq = randomVector(q.size(), 302), dk = randomVector(k.size(), 303);
    const auto dv = randomVector(v.size(), 304);
    const auto dq0 = dq, dk0 = dk;
    ropeBackward(dq.data(), sh.s, sh.b, sh.nq, sh.d, theta, posOffset);
    ropeBackward(dk.data(), sh.s, sh.b, sh.ng, sh.d, theta, posOffset);
    std::vector<float> want(qkv.size());
    for (int64_t t = 0; t < T; ++t)
        for (int g = 0; g < sh.ng; ++g)
            for (int i = 0; i < sh.d; ++i) {
                for (int j = 0; j < r; ++j)
                    want[size_t(qkvIndex(sh, t, g, j, i))] = dq[((t * sh.nq) + g * r + j) * sh.d + i];
                want[size_t(qkvIndex(sh, t, g, r, i))] = dk[(t * sh.ng + g) * sh.d + i];
                want[size_t(qkvIndex(sh, t, g, r + 1, i))] = dv[(t * sh.ng + g) * sh.d + i];
            }
    std::vector<float> got(qkv.size(), -1.0f);
    ropeBackwardMergeQkv(dq0.data(), dk0.data(), dv.data(), got.data(), sh.s, sh.b, sh.nq, sh.ng,
                         sh.d, theta, posOffset);
    expectBitEqual(got, want, "dqkv");
}

INSTANTIATE_TEST_SUITE_P(Shapes, QkvRope,
                         ::testing::Values(Shape{5, 3, 4, 2, 8}, Shape{4, 2, 3, 3, 6},
                                           Shape{3, 2, 4, 1, 7}, Shape{2, 1, 2, 2, 1}));

}  // namespace
}  // namespace ts::kernels::cpu
