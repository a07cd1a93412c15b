"""The vector ISA generated C is compiled for: what the compiler targets with the kernel flags
(``-march=native`` on this machine), read from its predefined macros, not assumed.

    isa = target_isa(options)      # Isa.AVX512 on a Zen 4 with -march=native
    isa.f32_lanes                  # 16

Schedules size their register tiles from it (`kiln.kernels.gemm_schedule.GemmConfig.for_isa`),
so the same program runs on a machine without AVX-512 with a tile that fits its registers.
The flags and the host CPU are already in the kernel cache key (`kiln.codegen.build`), so a
kernel built for one ISA is never loaded on another.
"""

from __future__ import annotations

import enum
import functools
import subprocess

from kiln.codegen.build import CompilerUnavailable, toolchain
from kiln.options import Options

__all__ = ["Isa", "target_isa"]


class Isa(enum.Enum):
    """Vector register width and count for fp32 FMA code."""

    AVX512 = ("avx512", 16, 32)  # zmm: 16 fp32 lanes, 32 registers
    AVX2 = ("avx2", 8, 16)  # ymm with FMA: 8 lanes, 16 registers
    VEC128 = ("vec128", 4, 16)  # SSE2 / NEON: 4 lanes (16 registers on x86)
    SCALAR = ("scalar", 1, 16)

    def __init__(self, label: str, f32_lanes: int, registers: int) -> None:
        self.label = label
        self.f32_lanes = f32_lanes
        self.registers = registers


_MACROS = ((Isa.AVX512, ("__AVX512F__",)), (Isa.AVX2, ("__AVX2__", "__FMA__")),
           (Isa.VEC128, ("__SSE2__",)), (Isa.VEC128, ("__ARM_NEON",)))


def target_isa(options: Options) -> Isa:
    """The ISA the kernel compiler targets with ``options.c_flags``; SCALAR where it cannot
    tell (no compiler: no kernels are built anyway)."""
    chain = toolchain(options)
    if isinstance(chain, CompilerUnavailable):
        return Isa.SCALAR
    return _isa(chain.compiler, chain.flags)


@functools.lru_cache(maxsize=16)
def _isa(compiler: str, flags: tuple[str, ...]) -> Isa:
    try:
        done = subprocess.run([compiler, *flags, "-dM", "-E", "-x", "c", "/dev/null"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return Isa.SCALAR
    defined = {line.split()[1] for line in done.stdout.splitlines()
               if line.startswith("#define ") and len(line.split()) > 1}
    for isa, macros in _MACROS:
        if all(m in defined for m in macros):
            return isa
    return Isa.SCALAR
