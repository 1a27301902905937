// TS_HD marks the functions of kernels/common/ that the CPU oracle and the CUDA kernels share:
// __host__ __device__ under nvcc, nothing for the host compiler.
#pragma once

#ifndef TS_HD
#if defined(__CUDACC__)
#define TS_HD __host__ __device__
#else
#define TS_HD
#endif
#endif
