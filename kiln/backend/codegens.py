"""kiln's code generators as the driver runs them: one object each, in one table (`CODEGENS`).

A generator's object says what it cannot print (the lowering leaves those ops as extern calls),
prints a scheduled graph's kernels and its wrappers, names its debug dump file, tells the stages
before it what they need to know (`traits`, kiln/ir/target.py: they never import code
generation), and brings the runtime's way of building and loading what it printed
(`kernel_library`, kiln/runtime/compiled_graph.py), which the compiled artifact carries: a graph
loaded from the AOT graph cache is built and loaded without the driver.
"""

from __future__ import annotations

import importlib.util

from kiln import config, logs
from kiln.codegen.cpp.body import unprintable_ops as cpp_unprintable_ops
from kiln.codegen.cpp.library import CppKernels, cpp_kernels, translation_units
from kiln.codegen.cpp_wrapper import cpp_wrapper
from kiln.codegen.triton.body import unprintable_ops as triton_unprintable_ops
from kiln.codegen.triton.module import TritonKernels, triton_kernels
from kiln.codegen.wrapper import WrapperCode, python_wrapper
from kiln.codegen.wrapper_plan import WrapperPlan
from kiln.ir.schedule import FusedKernel
from kiln.ir.target import CodegenTraits, Target
from kiln.native.build import workers
from kiln.runtime import triton_compile_workers
from kiln.runtime.compiled_graph import CPP_LIBRARY, TRITON_MODULE, KernelLibrary
from kiln.schedule.scheduler import gemm_template_mode

Kernels = CppKernels | TritonKernels


class Codegen:
    """One code generator, as the driver calls it: the driver asks it instead of asking which
    generator a graph has. Subclasses say what differs."""

    traits: CodegenTraits
    kernel_library: KernelLibrary
    kernels_file: str  # the kernels' file in the debug dump (KILN_DEBUG_DIR)
    kernel_arguments: str  # what the Python wrapper calls a kernel with: "pointers" or "tensors"

    @property
    def name(self) -> str:
        return self.traits.name

    def check_available(self, device: str) -> None:
        """NotImplementedError when it cannot compile graphs on `device` in this process."""

    def unprintable_ops(self) -> frozenset[str]:
        """The loop IR ops it has no code for: the lowering makes them extern calls."""
        raise NotImplementedError

    def prepare(self, device: str) -> None:
        """Work to start as soon as a graph for `device` is on its way (before the AOT layer,
        kiln/backend/backends.py, and again before the lowering), to overlap them."""

    def kernels(self, kernels: list[FusedKernel], target: Target) -> Kernels:
        """The scheduled kernels, printed."""
        raise NotImplementedError

    def units(self, kernels: Kernels) -> list[str]:
        """What its kernel library is built from (the artifact's `units`)."""
        raise NotImplementedError

    def kernel_source(self, kernels: Kernels, kernel: str) -> str:
        """The printed code of one scheduled kernel (by its name in the schedule), as it stands
        in the library: what the compile report shows beside the kernel's loop nest."""
        raise NotImplementedError

    def python_wrapper(self, plan: WrapperPlan) -> WrapperCode:
        return python_wrapper(plan, self.kernel_arguments)

    def native_wrapper(self, plan: WrapperPlan, functions: dict[str, tuple[str, int]]) -> str | None:
        """A wrapper compiled into the kernel library, run instead of the Python wrapper; None
        where the Python wrapper runs the graph."""
        return None


class CppCodegen(Codegen):
    """C++ kernels with OpenMP, built into one shared library: CPU graphs."""

    traits = CodegenTraits("cpp", gemm_templates=False, channels_last_convolutions=False, wide_product_rows=False,
                           symbolic_sizes=True)
    kernel_library = CPP_LIBRARY
    kernels_file = "kernels.cpp"
    kernel_arguments = "pointers"

    def check_available(self, device: str) -> None:
        if device != "cpu":
            raise NotImplementedError(f"backend.codegen is 'cpp', which runs on CPU only; this graph's tensors are on {device!r}")

    def unprintable_ops(self) -> frozenset[str]:
        return cpp_unprintable_ops()

    def kernels(self, kernels: list[FusedKernel], target: Target) -> CppKernels:
        return cpp_kernels(kernels)

    def units(self, kernels: CppKernels) -> list[str]:
        return translation_units(kernels, workers())

    def kernel_source(self, kernels: CppKernels, kernel: str) -> str:
        return kernels.sources[kernels.functions[kernel]]

    def native_wrapper(self, plan: WrapperPlan, functions: dict[str, tuple[str, int]]) -> str | None:
        """The graph's C++ wrapper when `backend.cpp_wrapper` asks for one and kiln can write it
        (else the Python wrapper runs, the reason logged under `KILN_LOGS=code`)."""
        if not config.backend.cpp_wrapper:
            return None
        try:
            return cpp_wrapper(plan, functions)
        except NotImplementedError as error:
            logs.log("code", "kiln backend: the Python wrapper runs this graph: %s", error)
            return None


class TritonCodegen(Codegen):
    """One Triton module of jit kernels: CUDA graphs, and CPU graphs under Triton's interpreter."""

    traits = CodegenTraits("triton", gemm_templates=True, channels_last_convolutions=True, wide_product_rows=True,
                           symbolic_sizes=False)
    kernel_library = TRITON_MODULE
    kernels_file = "kernels_triton.py"
    kernel_arguments = "tensors"

    def check_available(self, device: str) -> None:
        if importlib.util.find_spec("triton") is None:
            raise NotImplementedError("kiln generates Triton kernels for this graph, but the triton package is not "
                                      "installed: pip install 'triton>=3.6' (or kiln's `gpu` extra)")

    def unprintable_ops(self) -> frozenset[str]:
        return triton_unprintable_ops()

    def prepare(self, device: str) -> None:
        if device != "cpu":
            # Started now, their imports overlap the AOT layer and the lowering: they compile the
            # kernels at load (started once per process).
            triton_compile_workers.workers(workers())

    def kernels(self, kernels: list[FusedKernel], target: Target) -> TritonKernels:
        return triton_kernels(kernels, target.device, triton_tuning(target), gemm_template_mode(target) == "timed")

    def units(self, kernels: TritonKernels) -> list[str]:
        return [kernels.source]

    def kernel_source(self, kernels: TritonKernels, kernel: str) -> str:
        launcher = kernels.functions[kernel]
        return "\n\n".join([*(jit.source for jit in kernels.jit.get(launcher, [])), kernels.launchers[launcher]])


def triton_tuning(target: Target) -> str | None:
    """How a GPU graph's Triton kernels choose their block sizes: `backend.autotune` ("default":
    reductions among a few configs; "max-autotune": pointwise kernels and warps too), timed by
    Triton's autotuner at their first launch; None (the fixed rule) under the interpreter, where
    timing says nothing about a GPU, and with autotuning off."""
    if target.device == "cpu" or config.backend.autotune == "off":
        return None
    return config.backend.autotune


# The code generators by their name in the setting `backend.codegen`.
CODEGENS: dict[str, Codegen] = {codegen.name: codegen for codegen in (CppCodegen(), TritonCodegen())}
# The generator `backend.codegen = "auto"` picks for a device's graphs.
AUTO = {"cpu": "cpp", "cuda": "triton"}
