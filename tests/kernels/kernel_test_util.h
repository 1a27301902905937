// Shared helpers for the CPU kernel tests: deterministic random data, a central
// finite-difference gradient checker, and tolerance-aware comparisons.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace ts::kernels::cpu::testing {

inline std::vector<float> randomVector(size_t n, uint32_t seed, float lo = -1.0f,
                                       float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

inline double dotD(const std::vector<float>& a, const std::vector<float>& b) {
    double s = 0.0;
    for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
    return s;
}

// Expects |a - b| <= atol + rtol * |b| element-wise; reports the first few offenders.
inline void expectClose(const std::vector<float>& a, const std::vector<double>& b, double rtol,
                        double atol, const char* what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    int bad = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double tol = atol + rtol * std::fabs(b[i]);
        if (!(std::fabs(a[i] - b[i]) <= tol)) {
            if (++bad <= 5)
                ADD_FAILURE() << what << "[" << i << "]: got " << a[i] << " want " << b[i]
                              << " (tol " << tol << ")";
        }
    }
    EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << a.size() << " elements differ";
}

inline void expectClose(const std::vector<float>& a, const std::vector<float>& b, double rtol,
                        double atol, const char* what) {
    expectClose(a, std::vector<double>(b.begin(), b.end()), rtol, atol, what);
}

// Central finite differences of a scalar loss (computed by `loss` from the current contents
// of `x`) at the indices `idx` of x, compared with the analytic gradient `grad` (same size as
// x). Passes when ||fd - grad||_2 <= rtol * max(||fd||_2, ||grad||_2) + atol over the checked
// indices, and each element is within 10x that budget (catches a single wrong entry hiding
// in a large norm).
inline void checkGradient(std::vector<float>& x, const std::vector<float>& grad,
                          const std::function<double()>& loss, const std::vector<size_t>& idx,
                          double h, double rtol, const char* what, double atol = 1e-6) {
    ASSERT_EQ(x.size(), grad.size()) << what;
    std::vector<double> fd(idx.size());
    for (size_t k = 0; k < idx.size(); ++k) {
        const size_t i = idx[k];
        const float orig = x[i];
        x[i] = static_cast<float>(orig + h);
        const double lp = loss();
        x[i] = static_cast<float>(orig - h);
        const double lm = loss();
        x[i] = orig;
        // use the step actually representable in float
        const double hp = static_cast<double>(static_cast<float>(orig + h)) - orig;
        const double hm = orig - static_cast<double>(static_cast<float>(orig - h));
        fd[k] = (lp - lm) / (hp + hm);
    }
    double nd = 0, nf = 0, ng = 0, maxErr = 0;
    size_t worst = 0;
    for (size_t k = 0; k < idx.size(); ++k) {
        const double e = fd[k] - grad[idx[k]];
        nd += e * e;
        nf += fd[k] * fd[k];
        ng += static_cast<double>(grad[idx[k]]) * grad[idx[k]];
        if (std::fabs(e) > maxErr) {
            maxErr = std::fabs(e);
            worst = k;
        }
    }
    nd = std::sqrt(nd);
    const double scaleN = std::max(std::sqrt(nf), std::sqrt(ng));
    EXPECT_GT(scaleN, 0.0) << what << ": gradient is identically zero, the check is vacuous";
    EXPECT_LE(nd, rtol * scaleN + atol)
        << what << ": ||fd - analytic|| = " << nd << " vs ||grad|| = " << scaleN;
    const double budget = 10 * (rtol * scaleN + atol);
    EXPECT_LE(maxErr, budget) << what << ": worst element " << idx[worst] << " fd=" << fd[worst]
                              << " analytic=" << grad[idx[worst]];
}

inline std::vector<size_t> allIndices(size_t n) {
    std::vector<size_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = i;
    return v;
}

// Up to `count` distinct indices of [0, n), deterministic.
inline std::vector<size_t> sampleIndices(size_t n, size_t count, uint32_t seed) {
    if (count >= n) return allIndices(n);
    std::vector<size_t> v = allIndices(n);
    std::mt19937 rng(seed);
    std::shuffle(v.begin(), v.end(), rng);
    v.resize(count);
    return v;
}

}  // namespace ts::kernels::cpu::testing
