"""What kind of op each OpInfo is, and whether kiln ran it as its own generated code.

Families: pointwise, reduction, view (shape and layout), indexing, other. OpInfo's own classes
decide first (`UnaryUfuncInfo`/`BinaryUfuncInfo` are pointwise, `ReductionOpInfo` reductions,
`ShapeFuncInfo` views); the tables below place the plain `OpInfo`s; anything unlisted is "other"
(matmul and convolution, linear algebra, FFT, sort/topk/median, scans, pooling and interpolation,
random and uninitialized factories, sparse).

An op "ran as kiln-generated code" when it passed and no graph of it called an ATen op as an extern
except the structural and library ops in `allowed_extern` (see there for the list and why).
"""

from __future__ import annotations

from torch.testing._internal.opinfo.core import BinaryUfuncInfo, OpInfo, ReductionOpInfo, ShapeFuncInfo, UnaryUfuncInfo

FAMILIES = ("pointwise", "reduction", "view", "indexing", "other")

POINTWISE = {
    "addcdiv", "addcmul", "clamp", "lerp", "where", "masked_fill", "logaddexp2", "diff", "tril", "triu", "to",
    "nn.functional.gelu", "nn.functional.glu", "nn.functional.hardswish", "nn.functional.leaky_relu",
    # Factories with defined values: a constant, or a function of the index.
    "full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "new_full", "new_ones", "new_zeros", "zero_",
    "scalar_tensor", "arange", "linspace", "logspace", "eye",
    "signal.windows.bartlett", "signal.windows.blackman", "signal.windows.cosine", "signal.windows.exponential",
    "signal.windows.gaussian", "signal.windows.general_cosine", "signal.windows.general_hamming",
    "signal.windows.hamming", "signal.windows.hann", "signal.windows.kaiser", "signal.windows.nuttall",
}

REDUCTION = {
    "max", "min",  # their binary variants are BinaryUfuncInfos, so pointwise
    "aminmax", "logsumexp", "var_mean", "std_mean", "norm", "renorm", "dist", "trace", "sum_to_size",
    "softmax", "log_softmax", "nn.functional.softmin", "torch.ops.aten._safe_softmax.default", "_softmax_backward_data",
    "masked.softmax", "masked.log_softmax", "masked.softmin", "masked.normalize", "masked.logaddexp",
    # Normalizations: statistics (reductions) then pointwise.
    "native_layer_norm", "nn.functional.layer_norm", "nn.functional.rms_norm", "nn.functional.group_norm",
    "native_group_norm", "nn.functional.batch_norm", "native_batch_norm", "_native_batch_norm_legit",
    "_batch_norm_with_update", "nn.functional.instance_norm", "nn.functional.normalize",
    "nn.functional.cosine_similarity", "nn.functional.pairwise_distance",
    # Losses: pointwise terms then a mean or sum (cross_entropy and nll_loss also gather the target's column).
    "nn.functional.mse_loss", "nn.functional.l1_loss", "nn.functional.smooth_l1_loss", "nn.functional.huber_loss",
    "nn.functional.binary_cross_entropy", "nn.functional.binary_cross_entropy_with_logits", "nn.functional.kl_div",
    "nn.functional.soft_margin_loss", "nn.functional.poisson_nll_loss", "nn.functional.gaussian_nll_loss",
    "nn.functional.hinge_embedding_loss", "nn.functional.margin_ranking_loss", "nn.functional.cosine_embedding_loss",
    "nn.functional.multilabel_soft_margin_loss", "nn.functional.triplet_margin_loss",
    "nn.functional.triplet_margin_with_distance_loss", "nn.functional.cross_entropy", "nn.functional.nll_loss",
    "nn.functional.multi_margin_loss", "nn.functional.multilabel_margin_loss",
}

VIEW = {
    "view", "view_as", "view_copy", "reshape", "reshape_as", "permute", "permute_copy", "transpose", "transpose_copy",
    "movedim", "expand", "expand_as", "expand_copy", "broadcast_to", "broadcast_tensors", "squeeze", "squeeze_copy",
    "unsqueeze", "unsqueeze_copy", "narrow", "narrow_copy", "select", "slice", "split", "split_with_sizes",
    "split_with_sizes_copy", "tensor_split", "hsplit", "vsplit", "dsplit", "chunk", "unsafe_chunk", "unsafe_split",
    "cat", "_chunk_cat", "stack", "hstack", "vstack", "dstack", "column_stack", "flatten", "unflatten", "ravel",
    "t", "t_copy", "T", "H", "mT", "mH", "unbind", "unbind_copy", "unfold", "unfold_copy", "diagonal", "diagonal_copy",
    "linalg.diagonal", "as_strided", "as_strided_copy", "alias_copy", "contiguous", "clone", "flip", "fliplr",
    "flipud", "rot90", "roll", "atleast_1d", "atleast_2d", "atleast_3d", "nn.functional.pad", "constant_pad_nd",
    "nn.functional.pixel_shuffle", "nn.functional.pixel_unshuffle", "nn.functional.channel_shuffle",
    "resolve_conj", "resolve_neg", "fft.fftshift", "fft.ifftshift", "meshgrid", "cartesian_prod", "block_diag",
}

INDEXING = {
    "__getitem__", "index_select", "index_add", "index_copy", "index_fill", "index_put", "index_reduce",
    "_unsafe_masked_index", "_unsafe_masked_index_put_accumulate", "gather", "scatter", "scatter_add",
    "scatter_reduce", "take", "take_along_dim", "put", "nn.functional.embedding", "nn.functional.embedding_bag",
    "masked_select", "masked_scatter", "select_scatter", "slice_scatter", "diagonal_scatter", "as_strided_scatter",
    "nonzero", "nonzero_static", "argwhere", "searchsorted", "bucketize", "repeat_interleave", "diag", "diag_embed",
    "diagflat", "nn.functional.one_hot", "nn.functional.unfold", "nn.functional.max_unpool1d",
    "nn.functional.max_unpool2d", "nn.functional.max_unpool3d",
}


def family(op: OpInfo) -> str:
    """The family of one OpInfo entry (name and variant: `max.binary` is pointwise, `max.reduction_*` not)."""
    if isinstance(op, (UnaryUfuncInfo, BinaryUfuncInfo)):
        return "pointwise"
    if isinstance(op, ReductionOpInfo):
        return "reduction"
    if isinstance(op, ShapeFuncInfo):
        return "view"
    if op.name == "norm" and op.variant_test_name == "nuc":
        return "other"  # the nuclear norm is a sum of singular values: an SVD
    for name, members in (("pointwise", POINTWISE), ("reduction", REDUCTION), ("view", VIEW), ("indexing", INDEXING)):
        if op.name in members:
            return name
    return "other"


# Externs that do not count against "kiln-generated":
STRUCTURAL = {"aten.as_strided"}  # how the wrapper hands a strided view of a buffer to an extern
LIBRARY = {
    # BLAS: kiln calls the vendor GEMM, as Inductor does by default on CPU.
    "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.mv", "aten.addmv", "aten.dot", "aten.vdot",
    # oneDNN convolutions and the fused attention kernels (flash for CPU, math, efficient).
    "aten.convolution", "aten.convolution_backward", "aten._convolution",
}
LIBRARY_PREFIXES = (
    "aten._scaled_dot_product_",  # SDPA variants, forward and backward
    "aten.linalg_", "aten._linalg_", "aten.cholesky", "aten.triangular_solve", "aten.lu_", "aten._lu_",
    "aten.geqrf", "aten.ormqr",  # LAPACK
    "aten._fft_",  # pocketfft / MKL
    "mkldnn.", "mkl.",
)
# Not allowed, though Inductor also calls some of them on CPU: sort, topk, cumsum and the other scans,
# pooling, random ops, nonzero. They are loops a compiler can generate; counting them as kiln's
# would hide work to do.


def allowed_extern(op_name: str) -> bool:
    """An extern (as printed: `aten.mm.default`) that does not make an op count as an ATen fallback."""
    packet = op_name.rsplit(".", 1)[0] if op_name.count(".") >= 2 else op_name
    return packet in STRUCTURAL or packet in LIBRARY or op_name.startswith(LIBRARY_PREFIXES)


def fallback_externs(externs: tuple[str, ...] | list[str]) -> list[str]:
    """The externs among `externs` that are ATen fallbacks (not structural, not library), sorted, once each."""
    return sorted({e for e in externs if not allowed_extern(e)})
