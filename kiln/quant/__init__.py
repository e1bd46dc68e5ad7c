"""Weight-only quantization: `kiln.quantize(model, "int8")` / `"int4"`.

Every `nn.Linear` of the model becomes a `QuantizedLinear` (kiln/quant/linear.py) whose weight is
stored as int8 per output channel or int4 in groups with zero points (kiln/quant/weights.py);
activations stay float32 (or, for int4 with `activations="int8"`, are quantized per group at each
call). Eager runs the quantized model correctly (dequantizing each weight on
every call: slow, the reference); compiled with kiln, each such layer runs kiln's GEMM with the
dequantization inside it (docs/generation.md).
"""

from __future__ import annotations

from torch import nn

from kiln.quant.linear import LINEAR, QuantizedLinear, is_conv1d

__all__ = ["LINEAR", "QuantizedLinear", "quantize"]

_BITS = {"int8": 8, "int4": 4}
_ACTIVATIONS = ("float32", "int8")


def quantize(model: nn.Module, dtype: str, group_size: int | None = None, activations: str = "float32") -> nn.Module:
    """Replace every `nn.Linear` in `model` (and HF's `Conv1D`, GPT-2's) in place by its
    weight-only quantized form; returns `model`. `dtype`: "int8" (per output channel; no `group_size`) or "int4" (groups of
    `group_size` input features, default 128, an even number). `activations` (int4 only): "float32"
    (weight-only, the default), or "int8": each call quantizes the layer's input per row and group
    of `group_size` to int8 as well (as llama.cpp's Q4 x Q8 products do), which kiln multiplies with
    integer dot products (AVX512-VNNI, AVX-VNNI, AVX2; aarch64's sdot) at a decode step's rows; an error of ~0.4 %
    of each group's largest activation, well under the int4 weight's own (docs/generation.md).

    Example::

        model = kiln.quantize(model, "int4", group_size=64)
        model.forward = kiln.compile(model.forward)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"kiln.quantize: model must be an nn.Module, got {type(model).__name__}")
    if dtype not in _BITS:
        raise ValueError(f"kiln.quantize: dtype must be one of {', '.join(map(repr, _BITS))}, got {dtype!r}")
    bits = _BITS[dtype]
    if bits == 8 and group_size is not None:
        raise ValueError("kiln.quantize: group_size applies to 'int4' only ('int8' has one scale per output channel)")
    if activations not in _ACTIVATIONS:
        raise ValueError(f"kiln.quantize: activations must be one of {', '.join(map(repr, _ACTIVATIONS))}, "
                         f"got {activations!r}")
    if activations == "int8" and bits != 4:
        raise ValueError("kiln.quantize: activations='int8' applies to 'int4' only")
    group_size = 128 if group_size is None else group_size
    if bits == 4 and (not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 2 or group_size % 2):
        raise ValueError(f"kiln.quantize: group_size must be an even int >= 2 (e.g. 32, 64, 128), got {group_size!r}")
    if isinstance(model, nn.Linear):
        raise TypeError("kiln.quantize: model is itself an nn.Linear; wrap it in a module (nn.Sequential(linear))")
    targets = [(name, child) for name, child in model.named_modules() if _quantizable(child)]
    for name, linear in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, QuantizedLinear.from_linear(linear, bits, group_size if bits == 4 else 0,
                                                          activations == "int8"))
    return model


def _quantizable(module: nn.Module) -> bool:
    """An `nn.Linear`, or HF's `Conv1D` (GPT-2's projections: a Linear with its weight stored
    transposed). Not the Linear inside `nn.MultiheadAttention` (`NonDynamicallyQuantizableLinear`):
    its owner reads `out_proj.weight` itself, which a quantized layer no longer has."""
    if isinstance(module, nn.modules.linear.NonDynamicallyQuantizableLinear):
        return False
    return isinstance(module, nn.Linear) or is_conv1d(module)
