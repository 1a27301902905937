// What every benchmark's command line shares (options come as "--name value" pairs), and the
// median they report.
// checkArgs() handles --help / -h (prints the usage, exit code 0) and a trailing option
// without a value (prints the problem and the usage, exit code 2).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

namespace ts::bench {

// Returns the exit code main() should return now, or -1 to go on parsing.
inline int checkArgs(int argc, char** argv, const char* usage) {
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
            std::printf("%s\n", usage);
            return 0;
        }
    }
    if (argc % 2 == 0) {
        std::fprintf(stderr, "option %s needs a value\n%s\n", argv[argc - 1], usage);
        return 2;
    }
    return -1;
}

// The median of v (the upper of the two middle values for an even count); 0 for none.
inline double median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace ts::bench
