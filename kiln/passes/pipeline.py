"""The one ordered list of what kiln's backend does to an ATen graph before lowering.

The driver (kiln/backend/driver.py) runs these, in this order, each as a named and timed stage
whose result it can dump (`KILN_DEBUG_DIR`, `KILN_LOGS=passes`, `KILN_LOGS=compile_time`):

1. `SPECIALIZE_SIZES`: a graph whose inputs have symbolic sizes (or whose values it reads as
   numbers) is not compiled now: the runtime traces it again at each new set of concrete sizes
   and sends that static graph through the whole pipeline (kiln/runtime/specialized.py).
2. `REWRITES`, in order. Each rewrite edits the graph it is given in place (it does not copy) and
   returns whether it changed anything; the driver then recompiles the module's code. Rewrites get
   the `Target` (kiln/ir/target.py) so that a rewrite for one device or code generator can
   decline on others. The rewrites over frozen weights (conv_batchnorm, conv_prepack,
   gemm_prepack, gemm_layer_norm) do nothing in graphs without frozen inputs (training, or
   freezing off).
3. `SPLIT_CONSTANTS`: freezing's split of a graph with frozen inputs into a constants graph (run by
   the runtime once, and again when a frozen input changes) and the runtime graph that is lowered.

The setting `backend.disabled_passes` (`KILN_DISABLED_PASSES`) skips rewrites by name
(`rewrites()`): how kiln.debug.bisect finds the one that changes a model's result. Every rewrite
may be skipped alone; the graph is still compiled correctly, only with less done to it. Those that
build on an earlier one then find nothing to do: without `freeze` there are no frozen inputs, so
conv_batchnorm, conv_prepack, gemm_prepack and gemm_layer_norm change nothing and no constants
graph is split off; without `gemm_prepack`, gemm_layer_norm finds no kiln GEMM to fuse into;
without `dropout`, a training graph's native_dropout is ATen's own call. The two steps that are
not rewrites cannot be skipped: a graph with symbolic sizes must be specialized to be compiled,
and `split_constants` is what makes frozen inputs constants.
"""

from __future__ import annotations

from typing import Callable

from torch import fx

from kiln import config
from kiln.ir.target import Target
from kiln.passes.attention import attention
from kiln.passes.bias_epilogue import bias_epilogue
from kiln.passes.constant_split import split_constants
from kiln.passes.conv_batchnorm import conv_batchnorm
from kiln.passes.conv_layout import conv_layout
from kiln.passes.conv_padding import conv_padding
from kiln.passes.conv_prepack import conv_prepack
from kiln.passes.cse import cse
from kiln.passes.dead_code import dead_code
from kiln.passes.dropout import dropout
from kiln.passes.freeze import freeze
from kiln.passes.gemm_layer_norm import gemm_layer_norm
from kiln.passes.gemm_prepack import gemm_prepack
from kiln.passes.grouped_attention import grouped_attention
from kiln.passes.kiln_attention import kiln_attention
from kiln.passes.quantized_gemm import quantized_gemm
from kiln.passes.sibling_products import sibling_products
from kiln.passes.redundant_casts import redundant_casts
from kiln.passes.scatter_accumulate import scatter_accumulate
from kiln.passes.specialize_sizes import needs_specialization
from kiln.passes.wide_rows import wide_rows

Rewrite = Callable[[fx.GraphModule, Target], bool]  # edits the graph in place; True when it changed it

SPECIALIZE_SIZES = ("specialize_sizes", needs_specialization)

REWRITES: list[tuple[str, Rewrite]] = [
    ("freeze", freeze),  # module state -> frozen inputs, when backend.freezing is on
    ("redundant_casts", redundant_casts),
    ("cse", cse),  # the same pure call on the same operands once (a mask every layer converts)
    ("attention", attention),
    ("grouped_attention", grouped_attention),  # a decode step's grouped-query attention without copies of k and v
    ("kiln_attention", kiln_attention),  # ATen's CPU attention -> kiln's, where timed faster
    ("dropout", dropout),  # training-mode dropout: a seed per call, the mask computed in the kernels
    ("conv_padding", conv_padding),
    ("conv_batchnorm", conv_batchnorm),
    ("conv_prepack", conv_prepack),
    ("conv_layout", conv_layout),  # GPU: channels-last weights, the bias in the consumer's kernel
    ("bias_epilogue", bias_epilogue),
    ("sibling_products", sibling_products),  # float products reading the same input -> one, its output sliced
    ("wide_rows", wide_rows),  # GPU: a product of N columns not filling 16-byte lines -> into wider rows
    ("gemm_prepack", gemm_prepack),
    ("quantized_gemm", quantized_gemm),  # kiln.quantize's Linear layers -> kiln's GEMM over their packed weights
    ("gemm_layer_norm", gemm_layer_norm),  # after gemm_prepack: the products it gave kiln's GEMM
    ("scatter_accumulate", scatter_accumulate),
    ("dead_code", dead_code),
]

SPLIT_CONSTANTS = ("split_constants", split_constants)


def names() -> list[str]:
    """Every step of the pipeline by name, in the order the driver runs them."""
    return [SPECIALIZE_SIZES[0], *(name for name, _ in REWRITES), SPLIT_CONSTANTS[0]]


def rewrites() -> list[tuple[str, Rewrite]]:
    """`REWRITES` less those the setting `backend.disabled_passes` names, in order; a name that is
    not a rewrite is an error that lists the names accepted.

    Example::

        with kiln.config.patch({"backend.disabled_passes": ("gemm_prepack",)}):
            [name for name, _ in pipeline.rewrites()]  # every rewrite but gemm_prepack
    """
    disabled = config.backend.disabled_passes
    known = [name for name, _ in REWRITES]
    unknown = [name for name in disabled if name not in known]
    if unknown:
        raise ValueError(f"backend.disabled_passes (KILN_DISABLED_PASSES): {unknown[0]!r} is not a rewrite pass; "
                         f"accepted: {', '.join(known)} ({SPECIALIZE_SIZES[0]} and {SPLIT_CONSTANTS[0]} are not "
                         f"rewrites and always run)")
    return [(name, rewrite) for name, rewrite in REWRITES if name not in disabled]
