// Placeholder translation unit until the profiler library lands.
