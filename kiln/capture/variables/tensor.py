"""Tensors in the graph: an fx node plus the fake tensor that carries its metadata."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import fx

from kiln.capture.break_records import unsupported
from kiln.capture.guards import Guard
from kiln.capture.sources import AttrSource, ConvertedSource
from kiln.capture.user_exceptions import raise_real
from kiln.capture.variables import unbacked
from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.containers import SizeVariable
from kiln.capture.variables.symbolic import has_symbolic, size_item
from kiln.capture.variables.wrapping import wrap, wrap_constant_result

# Read from the fake tensor: they are fixed by the guards of the graph's inputs.
_STATIC_ATTRS = {
    "dtype", "device", "layout", "ndim", "is_cuda", "is_cpu", "is_sparse", "is_quantized", "is_meta",
    "is_mkldnn", "is_nested", "requires_grad", "is_leaf", "itemsize", "nbytes", "is_mps", "is_xpu",
}
_STATIC_METHODS = {
    "dim", "ndimension", "numel", "nelement", "element_size", "is_contiguous", "is_floating_point",
    "is_complex", "stride", "storage_offset", "get_device", "is_signed", "is_inference",
}
_DATA_DEPENDENT = {"item", "tolist", "numpy", "__bool__", "__index__", "__int__", "__float__", "data_ptr", "any_", "nonzero_static"}
_READS_KNOWN = {"item", "tolist", "__bool__", "__index__", "__int__", "__float__"}  # of a value known_values knows
_VIEW_ATTRS = {"T", "mT", "H", "mH", "real", "imag", "data"}
# Meta key of an input's placeholder whose identity the trace compared (`a is b`): its aliasing
# with the other inputs is guarded even where no op reads it (OutputGraph.aliasing_guard).
IDENTITY_READ = "kiln_identity_read"


class TensorVariable(Variable):
    def __init__(self, node: fx.Node, example: torch.Tensor, source: Any = None, cls: type = torch.Tensor) -> None:
        super().__init__(source)
        self.node, self.example, self.cls = node, example, cls

    def python_type(self) -> type:
        return self.cls

    def describe(self) -> str:
        return f"tensor {self.node.name} {tuple(self.example.shape)} {self.example.dtype}"

    def as_fx_arg(self) -> Any:
        if self.data_replaced:
            raise unsupported("unsupported_setattr", "an op on a tensor that requires grad after `tensor.data = ...` "
                              "inside a compiled function", "the graph breaks here")
        return self.node

    def as_example(self) -> Any:
        return self.example

    def size(self) -> Variable:
        return SizeVariable([size_item(self.node, i, s) for i, s in enumerate(self.example.shape)])

    def getattr(self, tx: Any, name: str) -> Variable:
        if name == "shape":
            return self.size()
        if name in _STATIC_ATTRS:
            return ConstantVariable(getattr(self.example, name))
        if name in _VIEW_ATTRS:
            return tx.output.call("call_function", getattr, [self, ConstantVariable(name)], {})
        if name == "grad" and "grad" not in self.attrs:
            return self._grad(tx)
        if name == "__class__":
            return wrap_constant_result(self.cls)
        if name in self.attrs:
            return self.attrs[name]
        if callable(getattr(torch.Tensor, name, None)):
            return TensorMethodVariable(self, name)
        if name == "grad_fn" and (not self.example.requires_grad or self.example.is_leaf):
            return ConstantVariable(None)  # (nn.Module.register_parameter asks)
        if hasattr(self.cls, name):
            # An attribute the class has that kiln does not model (grad_fn of a tensor computed
            # with grad, _version, _base, names, ...): not an AttributeError (it was one, wrongly).
            raise unsupported("unsupported_attribute", f"reading tensor.{name} inside a compiled function")
        real = getattr(self, "real", None)
        if real is not None and self.source is not None:
            # An input's own attribute (`x.test = ...` before the call): read, and its presence
            # guarded either way.
            present = name in getattr(real, "__dict__", {})
            tx.output.guards.add(Guard("HASATTR", self.source, present, name))
            if present:
                return wrap(tx, real.__dict__[name], AttrSource(self.source, name))
        raise raise_real(AttributeError(f"'Tensor' object has no attribute '{name}'"))

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name == "size":
            size = self.size()
            dim = args[0] if args else kwargs.get("dim")  # (`x.size(1)`, `x.size(dim=1)`)
            if dim is None or dim.is_constant() and dim.as_constant() is None:
                return size
            index, rank = dim.as_constant(), len(size.items)
            if rank == 0:
                raise raise_real(IndexError(f"dimension specified as {index} but tensor has no dimensions"))
            if isinstance(index, bool) or not isinstance(index, int) or not -rank <= index < rank:
                raise raise_real(IndexError(f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {index})"))
            return size.items[index]
        if name == "is_inference" and not args and not kwargs and getattr(self, "real", None) is not None:
            # (not among the facts every tensor input is guarded on: guarded where read)
            value = self.real.is_inference()
            tx.output.guards.add(Guard("EQUALS", ConvertedSource(self.source, torch.Tensor.is_inference), value))
            return ConstantVariable(value)
        if name in _STATIC_METHODS:
            try:
                value = getattr(self.example, name)(*[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
            except Exception as error:  # noqa: BLE001 - the user's call is wrong in eager too
                raise raise_real(error) from None
            if has_symbolic(value):  # numel() or stride() of a tensor with dynamic sizes
                return tx.output.call("call_method", name, [self, *args], kwargs)
            return wrap_constant_result(value)
        if name == "__iter__" and not args and not kwargs:  # (`x.__iter__()`: iter(x))
            return self.get_iter(tx)
        if name == "numpy" and not args:
            return self._numpy(tx, kwargs)
        if name in _DATA_DEPENDENT:
            known = tx.output.known.of(self)  # a small tensor computed from constants: its value is one too
            if known is not None and name in _READS_KNOWN:
                try:
                    return wrap_constant_result(getattr(known, name)())
                except Exception as error:  # noqa: BLE001 - eager raises the same (int() of two elements)
                    raise raise_real(error) from None
            if tx.output.scalar_outputs and name in unbacked.SCALAR_READS and not args and not kwargs:
                return unbacked.read(tx, self, name)
            raise unsupported(
                "data_dependent", f"tensor.{name}() reads tensor data while capturing",
                "the graph breaks here; keep the value a tensor, or move this out of the compiled code",
            )
        if name == "type" and not args and not kwargs:
            return ConstantVariable(self.example.type().replace("Fake", ""))
        if name == "type" and len(args) == 1 and set(kwargs) <= {"non_blocking"}:
            return self.call_method(tx, "to", [], {**_legacy_tensor_type(args[0]), **kwargs})
        if name == "__setitem__":
            tx.output.call("call_function", tensor_setitem, [self, *args], {})
            return ConstantVariable(None)
        if name == "requires_grad_" or name in ("register_hook", "retain_grad", "backward"):
            raise unsupported("unsupported_call", f"tensor.{name}() inside a compiled function")
        return tx.output.call("call_method", name, [self, *args], kwargs)

    def _numpy(self, tx: Any, kwargs: dict[str, Variable]) -> Variable:
        """`t.numpy()`: an array of the tensor's memory, in the graph (numpy_arrays.py); with
        `force=True`, of its detached CPU copy where it needs one."""
        from kiln.capture.variables.numpy_arrays import NumpyArrayVariable, numpy

        force = kwargs.get("force", ConstantVariable(False))
        if set(kwargs) - {"force"} or not force.is_constant() or numpy() is None:
            raise unsupported("unsupported_call", "tensor.numpy() with these arguments, or without NumPy imported")
        tensor: TensorVariable = self
        if self.example.requires_grad or self.example.device.type != "cpu":
            if not force.as_constant():
                what = "requires grad. Use tensor.detach().numpy()" if self.example.requires_grad else "is not on the CPU"
                raise raise_real(RuntimeError(f"Can't call numpy() on Tensor that {what} instead."))
            tensor = tx.output.call("call_method", "detach", [tensor], {})
            if self.example.device.type != "cpu":
                tensor = tx.output.call("call_method", "cpu", [tensor], {})
        return NumpyArrayVariable(tensor.node, tensor.example)

    def iterate(self, tx: Any) -> list[Variable]:
        if self.example.dim() == 0:
            raise raise_real(TypeError("iteration over a 0-d tensor"))
        return tx.output.call("call_method", "unbind", [self, ConstantVariable(0)], {}).items

    def length(self, tx: Any) -> int:
        if self.example.dim() == 0:
            raise raise_real(TypeError("len() of a 0-d tensor"))
        return int(self.example.shape[0])

    def truth(self, tx: Any) -> bool:
        known = tx.output.known.of(self)
        if known is not None:
            try:
                return bool(known)
            except Exception as error:  # noqa: BLE001 - as eager: the truth of several values is ambiguous
                raise raise_real(error) from None
        raise unsupported(
            "data_dependent_branch", f"the truth value of {self.describe()} decides Python control flow",
            "the graph breaks at the branch; use torch.where, or keep the branch outside the compiled code",
        )

    def setattr(self, tx: Any, name: str, value: Variable) -> None:
        """An attribute of the user's on the tensor object (`x.offloading = True`): an input's is
        written after the graph (side_effects.py), one of a tensor the graph made is set on the
        output when it leaves (reconstruct.py); later reads in the trace see it. Tensor's own
        attributes (`data`, `requires_grad`, ...) are not written here, but for `grad` set to a
        tensor of its shape and dtype (or None), which is kept the same way."""
        if name == "data" and self.source is not None and isinstance(value, TensorVariable):
            return self._set_data(tx, value)
        settable_grad = name == "grad" and (value.is_constant() and value.as_constant() is None or isinstance(value, TensorVariable)
                                            and value.example.shape == self.example.shape and value.example.dtype == self.example.dtype)
        if (hasattr(torch.Tensor, name) and not settable_grad) or name.startswith("__"):
            raise unsupported("unsupported_setattr", f"setting tensor attribute {name!r} inside a compiled function")
        if self.source is not None:
            tx.output.side_effects.record_setattr(self, name, value)
        self.attrs[name] = value

    def user_tensor(self, tx: Any) -> torch.Tensor | None:
        """The user's own tensor object this variable stands for: an input's (set by add_input) or a
        module's parameter or buffer; None for one the graph makes."""
        real = getattr(self, "real", None)
        if real is None and self.node.op == "get_attr":
            real = tx.output.attrs.get(self.node.target)
        return real

    def _grad(self, tx: Any) -> Variable:
        """`x.grad`: an input's or a parameter's read from the tensor itself (a graph input, or
        None, guarded); a tensor the graph makes has none (no backward runs inside a graph)."""
        real = self.user_tensor(tx)
        if real is not None and self.source is not None:
            return wrap(tx, real.grad, AttrSource(self.source, "grad"))
        if self.source is None and self.node.op not in ("placeholder", "get_attr"):
            return ConstantVariable(None)
        raise unsupported("unsupported_attribute", "reading tensor.grad of a tensor kiln cannot read again on the next call")

    def _set_data(self, tx: Any, value: "TensorVariable") -> None:
        """`x.data = y` on an input: the same object x, now over y's memory. Written after the graph
        (side_effects.py), y as it is now (a later `y.data = ...` does not change what x got); later
        reads of x in the trace read y's values. Where x or y requires grad, a later op on x would
        give its gradient to y's graph, not to x: such an op breaks the graph (as_fx_arg)."""
        snapshot = TensorVariable(value.node, value.example)
        tx.output.side_effects.record_setattr(self, "data", snapshot)
        self.data_replaced = self.data_replaced or self.example.requires_grad or value.example.requires_grad
        self.node, self.example = value.node, value.example

    data_replaced = False  # x.data was set where x or the new data requires grad (_set_data)

    @property
    def attrs(self) -> dict[str, Variable]:
        """The attributes the trace set on this tensor object, in the order first set."""
        if "_attrs" not in self.__dict__:
            self._attrs: dict[str, Variable] = {}
        return self._attrs


def tensor_setitem(tensor: torch.Tensor, index: Any, value: Any) -> None:
    tensor[index] = value


class TensorMethodVariable(Variable):
    """`x.view` before it is called."""

    def __init__(self, tensor: TensorVariable, name: str) -> None:
        super().__init__(None)
        self.tensor, self.name = tensor, name

    def python_type(self) -> type:
        return type(torch.empty(0).view)

    def describe(self) -> str:
        return f"method Tensor.{self.name}"

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return self.tensor.call_method(tx, self.name, args, kwargs)


def _legacy_tensor_type(kind: Variable) -> dict[str, Variable]:
    """`t.type(torch.HalfTensor)` / `t.type("torch.cuda.FloatTensor")` / `t.type(torch.float16)`: the
    dtype and device it names."""
    value = kind.as_constant() if kind.is_constant() else getattr(kind, "value", None)
    if isinstance(value, torch.dtype):  # (`t.type(torch.float16)`: the dtype, on the tensor's device)
        return {"dtype": ConstantVariable(value)}
    if isinstance(value, str):
        found: Any = torch if value.startswith("torch.") else None
        for part in value.split(".")[1:]:
            found = getattr(found, part, None)
        value = found
    if not isinstance(getattr(value, "dtype", None), torch.dtype) or not isinstance(getattr(value, "is_cuda", None), bool):
        raise raise_real(ValueError(f"invalid type: {kind.describe()}"))
    return {"dtype": ConstantVariable(value.dtype), "device": ConstantVariable("cuda" if value.is_cuda else "cpu")}
