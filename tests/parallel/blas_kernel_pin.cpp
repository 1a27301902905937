// test_parallel compares layouts with the single device, and layouts split GEMMs by rows (TP's
// overlap chunks, EP's experts, CP's halves, DP's batch): the comparisons need a CPU GEMM that
// gives a row the same bits however its GEMM is split. OpenBLAS's FMA kernels (Haswell, Zen) do
// not, and bf16 and FP8 rounding turn their last-bit differences into whole rounding steps; its
// AVX kernel (Sandybridge) does (docs/kernels.md, "Threading"). OpenBLAS picks its kernel when it
// is loaded, before any code of this program runs, from OPENBLAS_CORETYPE: so on x86-64, where
// that is unset, the program starts itself again with it set to Sandybridge, however it is run
// (CTest, by hand). An OPENBLAS_CORETYPE the caller sets is kept; where the request does not take
// (another BLAS, a build without DYNAMIC_ARCH), gemmSplitsRowsAlike() notices and the FP8 layout
// tests allow FP8's noise (parallel_test_util.h).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

#if defined(__x86_64__)
[[maybe_unused]] const bool g_pinned = [] {
    if (std::getenv("OPENBLAS_CORETYPE")) return false;
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    const std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> args;
    for (size_t at = 0; at < raw.size();) {
        const size_t end = raw.find('\0', at);
        args.push_back(raw.substr(at, end == std::string::npos ? std::string::npos : end - at));
        if (end == std::string::npos) break;
        at = end + 1;
    }
    if (args.empty() || ::setenv("OPENBLAS_CORETYPE", "Sandybridge", 1) != 0) return false;
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    // execv returned: run on with the kernel OpenBLAS chose (the probe tells the tests).
    std::fprintf(stderr, "note: could not restart with OPENBLAS_CORETYPE=Sandybridge; running on\n");
    ::unsetenv("OPENBLAS_CORETYPE");
    return false;
}();
#endif

}  // namespace
