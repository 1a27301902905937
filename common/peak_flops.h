// The peak FLOPS table (resources/peak_flops.json): peak dense TFLOP/s per device name and
// dtype. Shared by the profiler (MFU in `trainscope analyze`) and the CUDA backend
// (DeviceInfo::peakTflops*, `trainscope devices`), so both read one table the same way.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "common/status.h"

namespace ts {

// JSON {"devices": {"<device name>": {"<dtype>": tflops, ...}}}.
struct PeakFlopsTable {
    std::map<std::string, std::map<std::string, double>> tflops;  // device -> dtype -> TFLOP/s
    // Exact name, else the longest table key contained in deviceName (case-insensitive).
    std::optional<double> lookup(const std::string& deviceName, const std::string& dtype) const;
};
Result<PeakFlopsTable> loadPeakFlopsTable(const std::string& path);
// resources/peak_flops.json of the source tree (TS_SOURCE_DIR), or of the working directory,
// its parent, or ../share/trainscope; "" when not found.
std::string defaultPeakFlopsTablePath();

}  // namespace ts
