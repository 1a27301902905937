// GEMM (all transpose combos, leading dims, alpha/beta, strided batch), linear forward/backward,
// embedding and elementwise helpers against naive references and finite differences.
#include "kernel_test_util.h"
#include "kernels/cpu/ops.h"

#include <cstring>
#include <thread>

namespace ts::kernels::cpu {
namespace {

using testing::randomVector;

// Naive row-major reference in double.
std::vector<double> refGemm(bool tA, bool tB, int M, int N, int K, double alpha,
                            const std::vector<float>& A, int lda, const std::vector<float>& B,
                            int ldb, double beta, const std::vector<float>& C, int ldc) {
    std::vector<double> out(C.begin(), C.end());
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            double acc = 0;
            for (int p = 0; p < K; ++p) {
                const double a = tA ? A[static_cast<size_t>(p) * lda + i] : A[static_cast<size_t>(i) * lda + p];
                const double b = tB ? B[static_cast<size_t>(j) * ldb + p] : B[static_cast<size_t>(p) * ldb + j];
                acc += a * b;
            }
            out[static_cast<size_t>(i) * ldc + j] = alpha * acc + beta * C[static_cast<size_t>(i) * ldc + j];
        }
    return out;
}

TEST(KernelsGemm, AllTransposeCombosWithLeadingDimsMatchNaive) {
    const int M = 13, N = 17, K = 11;
    for (int combo = 0; combo < 4; ++combo) {
        const bool tA = combo & 1, tB = combo & 2;
        // padded leading dims: 3 extra columns in every stored matrix
        const int lda = (tA ? M : K) + 3, ldb = (tB ? K : N) + 3, ldc = N + 3;
        const auto A = randomVector(static_cast<size_t>(tA ? K : M) * lda, 1 + combo);
        const auto B = randomVector(static_cast<size_t>(tB ? N : K) * ldb, 11 + combo);
        auto C = randomVector(static_cast<size_t>(M) * ldc, 21 + combo);
        const auto want = refGemm(tA, tB, M, N, K, 0.7, A, lda, B, ldb, -0.3, C, ldc);
        gemm(tA, tB, M, N, K, 0.7f, A.data(), lda, B.data(), ldb, -0.3f, C.data(), ldc);
        testing::expectClose(C, want, 1e-5, 1e-5, tA ? (tB ? "TT" : "TN") : (tB ? "NT" : "NN"));
    }
}

TEST(KernelsGemm, BetaZeroIgnoresGarbageInC) {
    const int M = 5, N = 6, K = 4;
    const auto A = randomVector(M * K, 3), B = randomVector(K * N, 4);
    std::vector<float> C(M * N, std::numeric_limits<float>::quiet_NaN());
    gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
    const auto want = refGemm(false, false, M, N, K, 1.0, A, K, B, N, 0.0,
                              std::vector<float>(M * N, 0.0f), N);
    testing::expectClose(C, want, 1e-5, 1e-6, "C");
}

TEST(KernelsGemm, StridedBatchedMatchesPerBatchNaive) {
    const int M = 4, N = 5, K = 3, batch = 3;
    const int64_t sA = M * K + 2, sB = N * K + 1, sC = M * N + 4;  // gaps between matrices
    const auto A = randomVector(sA * batch, 5), B = randomVector(sB * batch, 6);
    auto C = randomVector(sC * batch, 7);
    const auto C0 = C;
    gemmStridedBatched(false, true, M, N, K, 1.5f, A.data(), K, sA, B.data(), K, sB, 0.5f,
                       C.data(), N, sC, batch);
    for (int i = 0; i < batch; ++i) {
        std::vector<float> a(A.begin() + i * sA, A.begin() + i * sA + M * K);
        std::vector<float> b(B.begin() + i * sB, B.begin() + i * sB + N * K);
        std::vector<float> c0(C0.begin() + i * sC, C0.begin() + i * sC + M * N);
        std::vector<float> c(C.begin() + i * sC, C.begin() + i * sC + M * N);
        testing::expectClose(c, refGemm(false, true, M, N, K, 1.5, a, K, b, K, 0.5, c0, N), 1e-5,
                             1e-6, "batch");
        // the gap after each C matrix is untouched
        for (int64_t g = M * N; g < sC; ++g) EXPECT_EQ(C[i * sC + g], C0[i * sC + g]);
    }
}

TEST(KernelsGemm, ConcurrentSingleThreadedCallsAreCorrect) {
    // Rank threads call sgemm at the same time with OpenBLAS in 1-thread mode.
    const int previous = numThreads();
    setNumThreads(1);
    EXPECT_EQ(numThreads(), 1);
    const int n = 96;
    const auto A = randomVector(n * n, 8), B = randomVector(n * n, 9);
    const auto want = refGemm(false, false, n, n, n, 1.0, A, n, B, n, 0.0,
                              std::vector<float>(n * n, 0.0f), n);
    std::vector<std::vector<float>> results(4, std::vector<float>(n * n));
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r)
        threads.emplace_back([&, r] {
            for (int rep = 0; rep < 20; ++rep)
                gemm(false, false, n, n, n, 1.0f, A.data(), n, B.data(), n, 0.0f,
                     results[r].data(), n);
        });
    for (auto& t : threads) t.join();
    for (auto& res : results) testing::expectClose(res, want, 1e-5, 1e-5, "thread result");
    setNumThreads(previous);
}

TEST(KernelsGemm, MeasuredPeakIsPositiveAndRestoresThreads) {
    const int previous = numThreads();
    const double gflops = measureSgemmPeakGflops(1, 128, 0.01);
    EXPECT_GT(gflops, 0.05);   // anything that runs at all
    EXPECT_LT(gflops, 1e5);    // and is not a division by a zero-ish time
    EXPECT_EQ(numThreads(), previous);
}

TEST(KernelsLinear, ForwardMatchesNaiveWithAndWithoutBias) {
    const int T = 7, in = 9, out = 5;
    const auto x = randomVector(T * in, 10), W = randomVector(out * in, 11),
               b = randomVector(out, 12);
    for (bool withBias : {true, false}) {
        std::vector<float> y(T * out, 123.0f);  // garbage must be overwritten
        linearForward(x.data(), W.data(), withBias ? b.data() : nullptr, y.data(), T, in, out);
        std::vector<double> want(T * out);
        for (int t = 0; t < T; ++t)
            for (int o = 0; o < out; ++o) {
                double acc = withBias ? b[o] : 0.0;
                for (int i = 0; i < in; ++i) acc += static_cast<double>(x[t * in + i]) * W[o * in + i];
                want[t * out + o] = acc;
            }
        testing::expectClose(y, want, 1e-5, 1e-6, withBias ? "y(bias)" : "y");
    }
}

TEST(KernelsLinear, BackwardMatchesFiniteDifferencesAndAccumulates) {
    const int T = 6, in = 5, out = 4;
    auto x = randomVector(T * in, 13), W = randomVector(out * in, 14), b = randomVector(out, 15);
    const auto r = randomVector(T * out, 16);  // loss = sum(r * y)
    auto loss = [&] {
        std::vector<float> y(T * out);
        linearForward(x.data(), W.data(), b.data(), y.data(), T, in, out);
        return testing::dotD(r, y);
    };
    std::vector<float> dx(T * in), dW(out * in, 0.0f), db(out, 0.0f);
    linearBackward(r.data(), x.data(), W.data(), dx.data(), dW.data(), db.data(), T, in, out);
    testing::checkGradient(x, dx, loss, testing::allIndices(x.size()), 1e-2, 1e-3, "dx");
    testing::checkGradient(W, dW, loss, testing::allIndices(W.size()), 1e-2, 1e-3, "dW");
    testing::checkGradient(b, db, loss, testing::allIndices(b.size()), 1e-2, 1e-3, "db");
    // a second backward accumulates dW/db (+=) and leaves dx overwritten
    std::vector<float> dx2(T * in, 99.0f), dW2 = dW, db2 = db;
    linearBackward(r.data(), x.data(), W.data(), dx2.data(), dW2.data(), db2.data(), T, in, out);
    testing::expectClose(dx2, dx, 1e-6, 0, "dx overwritten");
    for (size_t i = 0; i < dW.size(); ++i) EXPECT_NEAR(dW2[i], 2 * dW[i], 1e-5);
    for (size_t i = 0; i < db.size(); ++i) EXPECT_NEAR(db2[i], 2 * db[i], 1e-5);
    // null dx / dW / db are skipped
    linearBackward(r.data(), x.data(), W.data(), nullptr, nullptr, nullptr, T, in, out);
}

// The MoE experts' grouped GEMMs: each group's rows times its own weight (and bias), against a
// double reference written out here; an empty group, rows before the first group and after the
// last untouched, dW and db accumulated per group, and the null arrays skipped.
TEST(KernelsLinear, GroupedMatchesADoubleReferencePerGroup) {
    const int in = 6, out = 5, G = 4, total = 14;
    const int off[G + 1] = {2, 6, 6, 7, 12};  // group 1 empty; rows 0-1 and 12-13 in no group
    const auto x = randomVector(size_t(total) * in, 30), dy = randomVector(size_t(total) * out, 31);
    std::vector<std::vector<float>> W, b, dW, db;
    for (int g = 0; g < G; ++g) {
        W.push_back(randomVector(size_t(out) * in, 40 + g));
        b.push_back(randomVector(size_t(out), 50 + g));
        dW.push_back(randomVector(size_t(out) * in, 60 + g));  // accumulated into
        db.push_back(randomVector(size_t(out), 70 + g));
    }
    std::vector<const float*> Wp, bp;
    std::vector<float*> dWp, dbp;
    for (int g = 0; g < G; ++g) {
        Wp.push_back(W[size_t(g)].data());
        bp.push_back(g == 2 ? nullptr : b[size_t(g)].data());  // a group without a bias
        dWp.push_back(dW[size_t(g)].data());
        dbp.push_back(db[size_t(g)].data());
    }
    std::vector<float> y(size_t(total) * out, 77.0f), dx(size_t(total) * in, 88.0f);
    const auto dW0 = dW, db0 = db;
    linearForwardGrouped(x.data(), Wp.data(), bp.data(), y.data(), off, G, in, out);
    linearBackwardGrouped(dy.data(), x.data(), Wp.data(), dx.data(), dWp.data(), dbp.data(), off, G, in, out);
    std::vector<double> wantY(y.size(), 77.0), wantDx(dx.size(), 88.0);
    auto wantDW = std::vector<std::vector<double>>(G), wantDb = std::vector<std::vector<double>>(G);
    for (int g = 0; g < G; ++g) {
        wantDW[size_t(g)].assign(dW0[size_t(g)].begin(), dW0[size_t(g)].end());
        wantDb[size_t(g)].assign(db0[size_t(g)].begin(), db0[size_t(g)].end());
        for (int r = off[g]; r < off[g + 1]; ++r) {
            for (int o = 0; o < out; ++o) {
                double acc = bp[size_t(g)] ? double(b[size_t(g)][size_t(o)]) : 0.0;
                for (int i = 0; i < in; ++i) acc += double(x[size_t(r) * in + i]) * W[size_t(g)][size_t(o) * in + i];
                wantY[size_t(r) * out + o] = acc;
                const double d = dy[size_t(r) * out + o];
                wantDb[size_t(g)][size_t(o)] += d;
                for (int i = 0; i < in; ++i) wantDW[size_t(g)][size_t(o) * in + i] += d * x[size_t(r) * in + i];
            }
            for (int i = 0; i < in; ++i) {
                double acc = 0;
                for (int o = 0; o < out; ++o) acc += double(dy[size_t(r) * out + o]) * W[size_t(g)][size_t(o) * in + i];
                wantDx[size_t(r) * in + i] = acc;
            }
        }
    }
    testing::expectClose(y, wantY, 1e-5, 1e-6, "y");
    testing::expectClose(dx, wantDx, 1e-5, 1e-6, "dx");
    for (int g = 0; g < G; ++g) {
        testing::expectClose(dW[size_t(g)], wantDW[size_t(g)], 1e-5, 1e-6, "dW");
        testing::expectClose(db[size_t(g)], wantDb[size_t(g)], 1e-5, 1e-6, "db");
    }
    // null dx, dW and db arrays: nothing written
    const auto dWBefore = dW;
    std::vector<float> dx2(dx.size(), 5.0f);
    linearBackwardGrouped(dy.data(), x.data(), Wp.data(), nullptr, nullptr, nullptr, off, G, in, out);
    linearBackwardGrouped(dy.data(), nullptr, Wp.data(), dx2.data(), nullptr, nullptr, off, G, in, out);
    EXPECT_EQ(dW, dWBefore);
    for (size_t i = 0; i < size_t(off[0]) * in; ++i) ASSERT_EQ(dx2[i], 5.0f);
    for (size_t i = size_t(off[G]) * in; i < dx2.size(); ++i) ASSERT_EQ(dx2[i], 5.0f);
    for (size_t i = size_t(off[0]) * in; i < size_t(off[G]) * in; ++i) ASSERT_EQ(dx2[i], dx[i]);
}

TEST(KernelsEmbedding, VocabPartitionsSumToFullLookupAndCountInvalid) {
    const int V = 10, C = 3, T = 6;
    const auto table = randomVector(V * C, 17);
    const std::vector<int32_t> ids = {0, 9, 4, 5, -1, 10};
    std::vector<float> full(T * C), part0(T * C), part1(T * C);
    EXPECT_EQ(embeddingForward(ids.data(), table.data(), full.data(), T, C, 0, V, V), 2);
    embeddingForward(ids.data(), table.data(), part0.data(), T, C, 0, 5, V);
    embeddingForward(ids.data(), table.data() + 5 * C, part1.data(), T, C, 5, 10, V);
    for (int t = 0; t < T; ++t)
        for (int c = 0; c < C; ++c) {
            const bool valid = ids[t] >= 0 && ids[t] < V;
            const float want = valid ? table[ids[t] * C + c] : 0.0f;
            EXPECT_EQ(full[t * C + c], want);
            EXPECT_EQ(part0[t * C + c] + part1[t * C + c], want);
        }
    EXPECT_EQ(countInvalidIds(ids.data(), T, V), 2);
}

// The lookups the engine runs: embeddingLookup is embeddingForward without the count, and the
// Bf16 variants read a bf16 model copy's bits and give exactly the rows of the unpacked table
// (bf16 -> fp32 is exact), zero rows where embeddingForward has them; the position table too.
TEST(KernelsEmbedding, LookupsFromTheBf16BitsEqualTheUnpackedTable) {
    const int V = 10, C = 5, T = 7;
    const std::vector<int32_t> ids = {0, 9, 4, 5, -1, 10, 7};
    const auto table = randomVector(V * C, 19);
    std::vector<uint16_t> bits(table.size());
    floatToBf16(table.data(), bits.data(), int64_t(table.size()));
    std::vector<float> unpacked(table.size());
    bf16ToFloat(bits.data(), unpacked.data(), int64_t(bits.size()));
    for (const auto& [start, end] : {std::pair{0, V}, std::pair{3, 8}}) {
        std::vector<float> want(T * C, 7.0f), plain(T * C, 8.0f), fromBits(T * C, 9.0f);
        embeddingForward(ids.data(), unpacked.data() + start * C, want.data(), T, C, start, end, V);
        embeddingLookup(ids.data(), unpacked.data() + start * C, plain.data(), T, C, start, end, V);
        embeddingLookupBf16(ids.data(), bits.data() + start * C, fromBits.data(), T, C, start, end, V);
        EXPECT_EQ(0, std::memcmp(plain.data(), want.data(), want.size() * sizeof(float))) << start;
        EXPECT_EQ(0, std::memcmp(fromBits.data(), want.data(), want.size() * sizeof(float))) << start;
        EXPECT_NE(want[size_t(2 * C)], 0.0f);  // id 4 is owned by both ranges: a real row, not zeros
    }
    const int s = 3, b = 2;
    const auto out0 = randomVector(s * b * C, 20);
    auto want = out0, got = out0;
    positionEmbeddingForward(unpacked.data(), want.data(), s, b, C);
    positionEmbeddingForwardBf16(bits.data(), got.data(), s, b, C);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)));
    EXPECT_NE(0, std::memcmp(got.data(), out0.data(), out0.size() * sizeof(float)));
}

TEST(KernelsEmbedding, BackwardScatterAddsOwnedRows) {
    const int C = 2, T = 5;  // vocab of 6, this rank owns rows [1, 4)
    const std::vector<int32_t> ids = {1, 3, 1, 5, 2};
    const auto dout = randomVector(T * C, 18);
    std::vector<float> dt(3 * C, 1.0f);  // owns rows [1, 4), starts at 1 to check +=
    embeddingBackward(ids.data(), dout.data(), dt.data(), T, C, 1, 4);
    std::vector<double> want(3 * C, 1.0);
    for (int t = 0; t < T; ++t)
        if (ids[t] >= 1 && ids[t] < 4)
            for (int c = 0; c < C; ++c) want[(ids[t] - 1) * C + c] += dout[t * C + c];
    testing::expectClose(dt, want, 1e-6, 1e-7, "dtable");
}

TEST(KernelsElementwise, HelpersMatchScalarLoops) {
    const int T = 5, C = 7;
    const int64_t n = T * C;
    const auto a = randomVector(n, 19), b = randomVector(n, 20), bias = randomVector(C, 21);
    std::vector<float> y(n);
    add(a.data(), b.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y[i], a[i] + b[i]);
    addInPlace(y.data(), a.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y[i], (a[i] + b[i]) + a[i]);
    scale(y.data(), 0.5f, n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y[i], ((a[i] + b[i]) + a[i]) * 0.5f);
    std::vector<float> z = a;
    addBias(z.data(), bias.data(), T, C);
    std::vector<float> db(C, 0.0f);
    biasGradAccumulate(a.data(), db.data(), T, C);
    for (int t = 0; t < T; ++t)
        for (int c = 0; c < C; ++c) EXPECT_EQ(z[t * C + c], a[t * C + c] + bias[c]);
    for (int c = 0; c < C; ++c) {
        double s = 0;
        for (int t = 0; t < T; ++t) s += a[t * C + c];
        EXPECT_NEAR(db[c], s, 1e-5);
    }
    double ss = 0;
    for (float v : a) ss += static_cast<double>(v) * v;
    EXPECT_NEAR(sumSquares(a.data(), n), ss, 1e-12 * ss + 1e-12);
    // Accumulated over pieces: the running double and, when asked, its float.
    double acc = 2.0;
    float accFloat = -1.f;
    sumSquaresAccumulate(a.data(), n / 2, &acc, nullptr);
    sumSquaresAccumulate(a.data() + n / 2, n - n / 2, &acc, &accFloat);
    EXPECT_EQ(acc, 2.0 + sumSquares(a.data(), n / 2) + sumSquares(a.data() + n / 2, n - n / 2));
    EXPECT_EQ(accFloat, float(acc));
    EXPECT_TRUE(allFinite(a.data(), n));
    auto bad = a;
    bad[n - 1] = std::numeric_limits<float>::infinity();
    EXPECT_FALSE(allFinite(bad.data(), n));
    bad[n - 1] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_FALSE(allFinite(bad.data(), n));
}

}  // namespace
}  // namespace ts::kernels::cpu
