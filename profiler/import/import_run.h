// Import into a run file: what `trainscope import` does. Creates a new run file (schema of
// profiler/store.h), feeds it through TraceWriter (the synchronous Recorder over a
// TraceStore), writes the importer's counts into the run's stats table and a RunInfo row
// whose source says where the trace came from (nsys | kineto | mixed).
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "profiler/import/importer.h"

namespace ts::profiler::import {

// outPath must not exist yet (or be empty). On failure the partly written file is removed;
// an import that yields no events at all is a failure (InvalidArgument).
// runName "" -> the first input's file name without extensions.
Result<ImportReport> importToRunFile(const std::vector<std::string>& paths, const std::string& outPath,
                                     const ImportOptions& options = {}, const std::string& runName = "");

// "trace_rank1.json.gz" -> "trace_rank1", "/a/b/report.sqlite" -> "report".
std::string traceStem(const std::string& path);

}  // namespace ts::profiler::import
