// Packed slice chunks (run file schema v2): the slices of one track are stored as chunks of at
// most kMaxChunkSlices rows, one SQLite row per chunk (table `slice_chunks`), because one
// SQLite row per slice caps the insert rate far below 1M slices/s (per-row VDBE + b-tree work).
//
// Blob layout (format byte kChunkFormat = 1), then per slice, in startNs order:
//   zigzag varint  startNs - previous startNs (the first relative to the row's ts_first)
//   zigzag varint  durNs
//   varint         name, category
//   varint         mask: bit k set = field k differs from its default
//                  (0 step, 1 microbatch, 2 chunk, 3 layer, 4 correlation, 5 bytes, 6 flops,
//                   7 group, 8 depth)
//   the present fields: signed ones zigzag varint, unsigned ones varint; flops as
//   varint(2*v) when it is a non-negative integer below 2^53, else varint(1) + 8 raw bytes.
// Slice ids are implicit: the chunk row's id + position.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/recorder.h"

namespace ts::profiler::codec {

inline constexpr uint8_t kChunkFormat = 1;
inline constexpr size_t kMaxChunkSlices = 1024;

// slices[0..n): one track, startNs non-decreasing. Appends the blob to out.
void encodeChunk(const trace::Slice* const* slices, size_t n, std::vector<uint8_t>& out);

// Appends n decoded slices (track and startNs filled from the row) to out. Returns false, with
// out restored to its old size, when the blob is malformed (wrong format, truncated, extra bytes).
bool decodeChunk(const uint8_t* data, size_t size, size_t n, uint32_t track, int64_t tsFirst,
                 std::vector<trace::Slice>& out);

// Stable order of slices by (track, startNs) as pointers into slices[0..n): linear time when
// each track's slices already come in time order (the common case), a sort per track otherwise.
void orderByTrackAndTs(const trace::Slice* slices, size_t n, std::vector<const trace::Slice*>& out);

}  // namespace ts::profiler::codec
