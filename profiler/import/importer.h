// Entry point of the trace importers: `trainscope import FILE...` and the GUI call this.
// Detects each file's format, parses it (nsys SQLite export or Kineto/Chrome JSON, plain or
// gzip), and feeds every file as one rank (or one rank per process for a multi-process nsys
// export) to a trace::Recorder, all on one clock. See docs/import.md.
#pragma once

#include <string>
#include <vector>

#include "common/recorder.h"
#include "common/status.h"
#include "profiler/import/staging.h"

namespace ts::profiler::import {

// From the file's first bytes: "SQLite format 3" -> Nsys; gzip magic or a JSON document
// start -> Kineto. A clear InvalidArgument for anything else (e.g. a .nsys-rep report), for a
// directory and for anything that is not a regular file (a FIFO would block).
Result<SourceFormat> detectFormat(const std::string& path);

struct ImportReport {
    EmitSummary summary;
    ImportStats stats;  // skipped / malformed / notable counts (names in docs/import.md)
};

// Imports every file into rec. Fails (and emits nothing) when a file is missing or is not a
// trace at all; malformed content inside a trace is skipped and counted instead.
Result<ImportReport> importTraces(const std::vector<std::string>& paths, trace::Recorder& rec,
                                  const ImportOptions& options = {});

}  // namespace ts::profiler::import
