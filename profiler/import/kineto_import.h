// PyTorch profiler / Kineto Chrome-trace JSON (plain or gzip) -> StagedFile.
//
// Streams the file through nlohmann's SAX parser (never builds a DOM), so memory stays a
// fraction of the file size. Mapping (docs/import.md):
//   kernel / gpu_memcpy / gpu_memset   -> slices on one GPU track per (device, stream)
//   cuda_runtime / cuda_driver         -> host slices carrying the CUPTI correlation id
//                                         (Launch when they launched GPU work)
//   user_annotation                    -> Range slices; ProfilerStep#N -> "step N", step=N
//   cpu_op, python_function, others    -> host slices of category Other
//   [memory] instants                  -> counters memory.allocated / memory.reserved
//                                         (memory.host_* for CPU memory)
//   distributedInfo.rank / world_size  -> rank hint; baseTimeNanoseconds -> epoch clock
// Timestamps are microseconds (integers or decimals); they are converted to integer ns from
// the number's text, so no precision is lost on epoch-sized values.
#pragma once

#include <string>

#include "common/status.h"
#include "profiler/import/staging.h"

namespace ts::profiler::import {

// Parses one Kineto/Chrome JSON trace. Malformed events are skipped and counted; a parse
// error or a truncated gzip keeps every event read before it (counted as
// import.kineto.parse_errors / import.truncated_input). Returns an error only when the file
// cannot be read or holds no trace at all.
Result<StagedFile> parseKinetoTrace(const std::string& path);

// Exposed for tests: a JSON number's text in microseconds -> integer nanoseconds, rounded
// half away from zero. False when it is not a finite number that fits in int64 ns.
bool microsTextToNs(std::string_view text, int64_t& ns);

}  // namespace ts::profiler::import
