"""Code generation: C/OpenMP kernels from loop-nest programs, compiled through a disk cache."""
