"""`QuantizedLinear`, the Linear layer `kiln.quantize` puts in a model, and the operator it calls.

The operator `kiln_quant::linear(x, qweight, scales, zeros, bits, group_size, bias, int8_activations)`
is what a captured graph holds: eager runs it by dequantizing the weight (and, with int8
activations, quantizing x per group and back) and calling ATen's linear (slow, always right: the
reference), and kiln's backend replaces it, once the weights are frozen, by
kiln's GEMM over the packed quantized weight (kiln/passes/quantized_gemm.py, `kiln::mm_quant`).
The layer's state is buffers (`qweight`, `scales`, `zeros`) and its bias: `state_dict` saves and
loads it like any module's.
"""

from __future__ import annotations

import torch
from torch import nn

from kiln.quant.weights import dequantize, quantize_activations, quantize_int4, quantize_int8

_LIBRARY = torch.library.Library("kiln_quant", "DEF")
_LIBRARY.define("linear(Tensor x, Tensor qweight, Tensor scales, Tensor? zeros, int bits, int group_size, "
                "Tensor? bias, bool int8_activations=False) -> Tensor")


def _linear(x, qweight, scales, zeros, bits, group_size, bias, int8_activations=False):
    weight = dequantize(qweight, scales, zeros, bits, group_size, x.shape[-1])
    if int8_activations:
        x = quantize_activations(x.to(torch.float32), group_size).to(x.dtype)
    return torch.nn.functional.linear(x, weight.to(x.dtype), bias if bias is None else bias.to(x.dtype))


def _linear_fake(x, qweight, scales, zeros, bits, group_size, bias, int8_activations=False):
    return x.new_empty((*x.shape[:-1], qweight.shape[0]))


_LIBRARY.impl("linear", _linear, "CompositeExplicitAutograd")
torch.library.register_fake("kiln_quant::linear", _linear_fake, lib=_LIBRARY)

LINEAR = torch.ops.kiln_quant.linear.default


def is_conv1d(module: nn.Module) -> bool:
    """Whether `module` is HF's `Conv1D` (transformers.pytorch_utils): x @ weight + bias, weight
    [in, out] (GPT-2's projections), found by name so that kiln does not import transformers."""
    return type(module).__name__ == "Conv1D" and type(module).__module__.startswith("transformers")


class QuantizedLinear(nn.Module):
    """y = x @ dequantize(weight)ᵀ + bias, the weight stored as int8 (per output channel) or int4
    (per group of `group_size` input features, with zero points); kiln/quant/weights.py. With
    `int8_activations` (int4), x's groups are quantized to int8 at each call first."""

    def __init__(self, in_features: int, out_features: int, bits: int, group_size: int, bias: bool,
                 int8_activations: bool = False) -> None:
        super().__init__()
        if int8_activations and bits != 4:
            raise ValueError("QuantizedLinear: int8_activations applies to int4 weights (bits=4) only")
        self.in_features, self.out_features, self.bits, self.group_size = in_features, out_features, bits, group_size
        self.int8_activations = int8_activations
        groups = 1 if bits == 8 else -(-in_features // group_size)
        columns = in_features if bits == 8 else (in_features + 1) // 2
        self.register_buffer("qweight", torch.zeros(out_features, columns, dtype=torch.int8 if bits == 8 else torch.uint8))
        self.register_buffer("scales", torch.ones(out_features, groups))
        self.register_buffer("zeros", torch.zeros(out_features, groups) if bits == 4 else None)
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Module, bits: int, group_size: int,
                    int8_activations: bool = False) -> "QuantizedLinear":
        """The quantized form of an `nn.Linear` or of HF's `Conv1D` (weight [in, out])."""
        weight = linear.weight.t() if is_conv1d(linear) else linear.weight
        out_features, in_features = weight.shape
        layer = cls(in_features, out_features, bits, group_size, linear.bias is not None, int8_activations)
        layer.to(weight.device)
        if bits == 8:
            qweight, scales = quantize_int8(weight)
            zeros = None
        else:
            qweight, scales, zeros = quantize_int4(weight, group_size)
        layer.qweight.copy_(qweight)
        layer.scales.copy_(scales)
        if zeros is not None:
            layer.zeros.copy_(zeros)
        if linear.bias is not None:  # (in the model's dtype: a bfloat16 model's layers stay bfloat16)
            layer.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        return layer

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 weight [out_features, in_features] this layer computes with."""
        return dequantize(self.qweight, self.scales, self.zeros, self.bits, self.group_size, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return LINEAR(x, self.qweight, self.scales, self.zeros, self.bits, self.group_size, self.bias,
                      self.int8_activations)

    def extra_repr(self) -> str:
        kind = "int8 per channel" if self.bits == 8 else f"int4, groups of {self.group_size}"
        if self.int8_activations:
            kind += ", int8 activations"
        return f"in_features={self.in_features}, out_features={self.out_features}, {kind}, bias={self.bias is not None}"
