"""A schedule's kernels as the C++ source of one shared library.

Kernels are printed under a placeholder name and then named by a hash of their text, so the
identical kernels of repeated layers become one function, compiled once. The sources are split
into about one translation unit per compile worker; each unit parses the preamble again, so small
graphs stay one unit, and the first unit alone defines the shared index-error flag.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from kiln.codegen.cpp.kernel import kernel_source
from kiln.codegen.cpp.preamble import preamble
from kiln.ir.schedule import FusedKernel

_PLACEHOLDER = "KILN_KERNEL"


@dataclass
class CppKernels:
    sources: dict[str, str] = field(default_factory=dict)  # C function -> its source, one per distinct kernel
    functions: dict[str, str] = field(default_factory=dict)  # kernel name -> C function
    vectorized: dict[str, bool] = field(default_factory=dict)  # kernel name -> has a vector loop
    checks: list[str] = field(default_factory=list)  # kernels after which the index-error flag is read
    arity: dict[str, int] = field(default_factory=dict)  # kernel name -> pointer arguments
    size_arguments: dict[str, list[str]] = field(default_factory=dict)  # kernel name -> size symbols after them

    @property
    def source(self) -> str:
        """The whole library as one text (for dumps and tests)."""
        return "\n\n".join([preamble(), *self.sources.values()])


def cpp_kernels(kernels: list[FusedKernel]) -> CppKernels:
    """Print every kernel (symbolic sizes become arguments after the pointers)."""
    printed = CppKernels()
    for kernel in kernels:
        if kernel.gemm is not None:
            raise NotImplementedError("a matrix product inside a C++ kernel (scheduled for Triton only)")
        text, vectorized, size_arguments = kernel_source(kernel, _PLACEHOLDER)
        function = f"kernel_{hashlib.sha256(text.encode()).hexdigest()[:16]}"
        printed.sources.setdefault(function, text.replace(_PLACEHOLDER, function))
        printed.functions[kernel.name] = function
        printed.vectorized[kernel.name] = vectorized
        printed.arity[kernel.name] = len(kernel.inputs) + len(kernel.outputs)
        printed.size_arguments[kernel.name] = size_arguments
        if "kiln_index(" in text or "kiln::vindex(" in text:
            printed.checks.append(kernel.name)  # indirect indexing: check the error flag after
    return printed


def translation_units(kernels: CppKernels, workers: int) -> list[str]:
    """The library's source in about one unit per compile worker (each unit parses the preamble,
    so small graphs stay one unit); the first unit defines the shared error flag."""
    functions = list(kernels.sources.values())
    count = max(1, min(workers, len(functions) // 4))
    chunks = [functions[k::count] for k in range(count)]
    return [preamble(defines_flag=k == 0) + "\n\n" + "\n\n".join(chunk) for k, chunk in enumerate(chunks)]
