// The scale of FP8 codes as a kernel reads it from their binding (kernels/common/fp8_codes.h): a
// host scale as given, or (kOnDevice) the one tensorwise scaling made from the tensor's amax,
// computed where the amax is as fp8QuantizeCurrent computed it (bit for bit: the same
// currentScaleDivided, IEEE divisions), or delayed scaling's step scale over its divisor, as
// fp8QuantizeDelayed divides it.
#pragma once

#include "kernels/common/fp8_codes.h"
#include "kernels/common/fp8_scalar.h"

namespace ts::kernels::cuda::detail {

__device__ inline float codesScale(const fp8codes::Binding& b) {
    if (b.scale != fp8codes::kOnDevice) return b.scale;
    if (b.scaleAt) return __fdiv_rn(*b.scaleAt, b.divisor);  // delayed: as fp8QuantizeDelayed
    return fp8s::currentScaleDivided(*b.amax, b.divisor, fp8s::fp8MaxOf(b.format));
}

}  // namespace ts::kernels::cuda::detail
