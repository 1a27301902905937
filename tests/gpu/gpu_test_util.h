// Shared by the gpu-labelled tests: TS_ASSERT_OK (a ts::Status is ok, else the expression and
// the status message); with CUDA, what the kernel-vs-CPU-oracle tests (test_cuda_*.cpp,
// test_kernels_cuda.cpp) all need: random inputs, a device buffer that frees itself, a fixture
// that gives each test a stream and skips it (GTEST_SKIP, with the reason) without a device,
// and element-wise comparisons that name the op/case and the first wrong elements' indices.
#pragma once

#include <gtest/gtest.h>

#include "common/status.h"

#define TS_ASSERT_OK(expr)                                        \
    do {                                                          \
        const ::ts::Status s_ = (expr);                           \
        ASSERT_TRUE(s_.isOk()) << #expr << ": " << s_.toString(); \
    } while (0)

#ifdef TS_HAVE_CUDA

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/common/float_bits.h"
#include "kernels/cuda/ops_cuda.h"

namespace ts::kernels::gputest {

// n values uniform in [lo, hi) from mt19937(seed).
inline std::vector<float> randomVec(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

// A device array of n T that frees itself: allocated (n = 0: one element's bytes, so ptr is
// real), optionally uploaded from a host vector; `status` says whether both worked.
template <typename T>
struct DeviceVec {
    T* ptr = nullptr;
    size_t n = 0;
    Status status;
    explicit DeviceVec(size_t count) : n(count) {
        void* p = nullptr;
        status = cuda::deviceAlloc(&p, sizeof(T) * (n ? n : 1));
        ptr = static_cast<T*>(p);
    }
    explicit DeviceVec(const std::vector<T>& host) : DeviceVec(host.size()) {
        if (status.isOk() && n) status = cuda::copyToDevice(ptr, host.data(), sizeof(T) * n);
    }
    DeviceVec(const DeviceVec&) = delete;
    DeviceVec& operator=(const DeviceVec&) = delete;
    ~DeviceVec() {
        if (ptr) (void)cuda::deviceFree(ptr);
    }
    std::vector<T> download() const {
        std::vector<T> h(n);
        if (n) {
            const Status s = cuda::copyToHost(h.data(), ptr, sizeof(T) * n);
            EXPECT_TRUE(s.isOk()) << s.toString();
        }
        return h;
    }
    T scalar() const {  // element 0
        T v{};
        const Status s = cuda::copyToHost(&v, ptr, sizeof(T));
        EXPECT_TRUE(s.isOk()) << s.toString();
        return v;
    }
};

// The fixture of the kernel tests: a CUDA stream per test (m_stream); without a usable device
// every test skips, saying why.
class CudaStreamTest : public ::testing::Test {
protected:
    void SetUp() override {
        int count = 0;
        const Status s = cuda::deviceCount(&count);
        if (!s.isOk() || count == 0)
            GTEST_SKIP() << "no CUDA device available (" << (s.isOk() ? "0 devices" : s.toString())
                         << ")";
        TS_ASSERT_OK(cuda::streamCreate(&m_stream));
    }
    void TearDown() override {
        if (m_stream) (void)cuda::streamDestroy(m_stream);
    }
    void sync() { TS_ASSERT_OK(cuda::streamSynchronize(m_stream)); }
    void* m_stream = nullptr;
};

// A float's bit pattern and back (as the kernels' shared scalar code does it).
using hd::floatBits;
using hd::floatFromBits;

// Element i's index in an array of `shape` ("[t, c]" for [T, C]); "[i]" when shape is empty.
inline std::string indexIn(size_t i, const std::vector<int>& shape) {
    if (shape.empty()) return "[" + std::to_string(i) + "]";
    std::vector<size_t> idx(shape.size());
    for (size_t a = shape.size(); a-- > 1;) {
        idx[a] = i % static_cast<size_t>(shape[a]);
        i /= static_cast<size_t>(shape[a]);
    }
    idx[0] = i;
    std::ostringstream os;
    os << "[";
    for (size_t a = 0; a < idx.size(); ++a) os << (a ? ", " : "") << idx[a];
    os << "]";
    return os.str();
}

// The comparison all the expect* below share: got and want of one size (that of `shape`, when
// given); the first 5 elements for which ok(i) fails are reported as what + index + detail(i),
// then how many failed.
template <typename Ok, typename Detail>
void expectEach(size_t gotSize, size_t wantSize, const std::string& what, const std::vector<int>& shape,
                Ok ok, Detail detail) {
    ASSERT_EQ(gotSize, wantSize) << what;
    if (!shape.empty()) {
        size_t total = 1;
        for (int e : shape) total *= static_cast<size_t>(e);
        ASSERT_EQ(total, wantSize) << what << ": shape does not match the size";
    }
    int bad = 0;
    for (size_t i = 0; i < gotSize; ++i)
        if (!ok(i) && ++bad <= 5) ADD_FAILURE() << what << indexIn(i, shape) << detail(i);
    EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << gotSize << " elements differ";
}

// " input 0x... = v" when the caller names the input element i came from, else "".
inline std::string inputNote(const std::vector<float>* input, size_t i) {
    if (!input) return "";
    std::ostringstream os;
    os << " input 0x" << std::hex << floatBits((*input)[i]) << std::dec << " = " << (*input)[i];
    return os.str();
}

// Bit-exact floats (so -0 != +0); any NaN equals any NaN.
inline void expectSameBits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what,
                           const std::vector<int>& shape = {}, const std::vector<float>* input = nullptr) {
    expectEach(
        got.size(), want.size(), what, shape,
        [&](size_t i) {
            return floatBits(got[i]) == floatBits(want[i]) || (std::isnan(got[i]) && std::isnan(want[i]));
        },
        [&](size_t i) {
            std::ostringstream os;
            os << ": gpu " << got[i] << " (0x" << std::hex << floatBits(got[i]) << ") cpu " << std::dec << want[i]
               << " (0x" << std::hex << floatBits(want[i]) << ")" << inputNote(input, i);
            return os.str();
        });
}

// Equal integers (codes, masks, flags, bit patterns).
template <typename T>
void expectEqualInts(const std::vector<T>& got, const std::vector<T>& want, const std::string& what,
                     const std::vector<int>& shape = {}, const std::vector<float>* input = nullptr) {
    expectEach(
        got.size(), want.size(), what, shape, [&](size_t i) { return got[i] == want[i]; },
        [&](size_t i) {
            std::ostringstream os;
            os << ": gpu " << +got[i] << " cpu " << +want[i] << inputNote(input, i);
            return os.str();
        });
}

// |gpu - cpu| <= atol + rtol * m, m = mag[i] (the magnitude of what element i was computed
// from) when mag is given, else |cpu|; equal infinities match; NaN matches NaN only when
// nanMatchesNan.
inline void expectClose(const std::vector<float>& got, const std::vector<float>& want, double rtol, double atol,
                        const std::string& what, const std::vector<int>& shape = {},
                        const std::vector<double>& mag = {}, bool nanMatchesNan = true) {
    if (!mag.empty()) {
        ASSERT_EQ(mag.size(), want.size()) << what << ": magnitudes";
    }
    auto tol = [&](size_t i) { return atol + rtol * (mag.empty() ? std::fabs(double(want[i])) : mag[i]); };
    expectEach(
        got.size(), want.size(), what, shape,
        [&](size_t i) {
            const float g = got[i], w = want[i];
            if (std::isnan(g) || std::isnan(w)) return nanMatchesNan && std::isnan(g) && std::isnan(w);
            if (std::isinf(g) || std::isinf(w)) return g == w;
            return std::fabs(double(g) - double(w)) <= tol(i);
        },
        [&](size_t i) {
            std::ostringstream os;
            os << ": gpu " << got[i] << " cpu " << want[i] << " (tol " << tol(i) << ")";
            return os.str();
        });
}

}  // namespace ts::kernels::gputest

#endif  // TS_HAVE_CUDA
