// Block-scaled FP8 (REFERENCE.md §6.4; TE's MXFP8BlockScaling and Float8BlockScaling recipes),
// emulated on the CPU: each block of a row-major matrix x [rows, cols] gets its own scale from its
// own amax (current scaling per block, no history), and y receives the values an FP8 GEMM reads
// after applying the block's inverse scale. "Along rows": blocks of consecutive elements of a row
// (a GEMM whose reduction dimension is cols); "along columns": consecutive elements of a column
// (reduction over rows, e.g. the wgrad's token dimension). The rowwise and columnwise
// quantizations of one tensor are both taken from the high-precision values, as TE does.
//
// MXFP8: 1x32 blocks, E8M0 scales (a biased power-of-two exponent; TE's float_to_e8m0 of
//   amax / fp8_max rounds up when any mantissa bit is set, so |x| / scale <= fp8_max).
// Blockwise (Float8BlockScaling): 1x128 blocks for activations and gradients, 128x128 tiles
//   for weights, fp32 scales fp8_max / amax, by default rounded down to a power of two (TE zeroes
//   the mantissa bits; NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1 keeps the fp32 quotient).
// Blocks at the end of a row/column (a dimension not a multiple of the block) are shorter.
#pragma once

#include <cstdint>

#include "kernels/cpu/ops.h"

namespace ts::kernels::cpu {

// E8M0 (TE float_to_e8m0 on architectures without the cvt.rp instruction): NaN -> 0xFF,
// inf -> 0xFE, 0 -> 0x00; else the fp32 biased exponent, plus one when any mantissa bit is set
// (round up), except at 0xFE (satfinite) and for subnormals up to 2^-127 (exponent 0, mantissa
// <= 0x400000), which stay at 0.
uint8_t e8m0FromFloat(float v);
// 2^(e - 127) (0x00 = 2^-127, a subnormal; 0xFF = NaN).
float e8m0ToFloat(uint8_t e);

enum class Fp8BlockKind : uint8_t {
    Mx1x32 = 0,      // MXFP8, 32 consecutive elements, E8M0 scale
    Block1x128,      // blockwise 1D, 128 consecutive elements, fp32 scale
    Block128x128,    // blockwise 2D tile (weights), fp32 scale
};

// Number of scales of x [rows, cols] quantized with `kind` along rows or columns (a 128x128 tile
// has one scale whatever the direction).
int64_t fp8BlockScaleCount(int64_t rows, int64_t cols, Fp8BlockKind kind, bool alongRows);
// Bytes of the quantized tensor: one per element plus its scales (E8M0: 1 byte, fp32: 4).
int64_t fp8BlockBytes(int64_t rows, int64_t cols, Fp8BlockKind kind, bool alongRows);

// Blockwise scale from a block's amax (REFERENCE.md §6.3 applied per block): fp8Max / amax, 1
// when amax is 0 or not finite, FLT_MAX on overflow; pow2: the mantissa bits zeroed.
float fp8BlockScale(float amax, float fp8Max, bool pow2);

// y = the dequantized block-scaled FP8 values of x (y may alias x). codes [rows*cols] (may be
// null) receive the FP8 codes; scales (may be null) the block scales in block order (blocks of a
// row left to right, rows top to bottom; along columns: the blocks of row-block 0 for every
// column, then row-block 1, ...): MXFP8 as E8M0 bytes in a uint8_t array, blockwise as the
// inverse scales (fp32) in a float array. pow2 applies to the blockwise kinds only.
void fp8BlockQuantizeDequantize(const float* x, float* y, uint8_t* codes, void* scales, int64_t rows, int64_t cols,
                                Fp8BlockKind kind, bool alongRows, Fp8Format f, bool pow2 = true);

}  // namespace ts::kernels::cpu
