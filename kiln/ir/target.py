"""What the backend compiles a graph for, as the stages before code generation need to know it.

The driver (kiln/backend/driver.py) makes one `Target` per graph, from the graph's device and the
code generator chosen for it, and hands it to every pass: a pass that rewrites an op into a form
only some code generators fuse well asks the target instead of importing a later stage.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CodegenTraits:
    """A code generator as the stages before it see it: what they do differently for it. It
    exists so that a pass or the scheduler reads a capability instead of comparing generator
    names or importing kiln/codegen (a later stage). Each generator's object in the driver's
    table (kiln/backend/codegens.py) declares its own."""

    name: str  # the setting's name for the generator ("cpp", "triton"), for logs and the artifact
    # It computes a matrix product inside the kernel of the product's pointwise consumers
    # (kiln/schedule/gemm_template.py), where `backend.triton_gemm` asks for that.
    gemm_templates: bool
    # Its convolutions run on channels-last weights, their bias added in the consumers' kernel
    # (kiln/passes/conv_layout.py).
    channels_last_convolutions: bool
    # Its library products (cuBLAS) want their output rows 16 bytes apart: an `mm` whose columns
    # do not fill whole lines writes into wider rows (kiln/passes/wide_rows.py).
    wide_product_rows: bool
    # It prints kernels over symbolic sizes, taken as arguments: a graph with symbolic sizes is
    # compiled once for all of them (kiln/passes/specialize_sizes.py), not once per size.
    symbolic_sizes: bool


@dataclass(frozen=True)
class Target:
    device: str  # "cpu"; the device type of the graph's tensors
    codegen: CodegenTraits  # the code generator that prints the graph's kernels
    loop_ops: frozenset  # ATen ops the lowering turns into loop IR (every other op is an extern call)
