// Placeholder translation unit until the CPU kernels land.
