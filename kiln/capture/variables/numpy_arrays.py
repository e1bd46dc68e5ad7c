"""NumPy arrays in the graph: an ndarray is carried as the tensor of its data, and what NumPy does
to it -- its functions, operators, methods and attributes -- runs in the graph as `torch._numpy`
does it (NumPy's semantics, dtypes and type promotion written in torch ops). So a function over
arrays compiles as one over tensors does, and the caller gets ndarrays back.

    def f(x):                    # x: an ndarray input, read as torch.from_numpy(x) (no copy)
        return np.sin(x) * 2     # graph: numpy_sin(x) -> numpy_mul(_, 2) ; returned as .numpy()

An ndarray input and `t.numpy()` share memory with their tensor, as in eager; an array returned
is the graph's output tensor seen as an ndarray (`Tensor.numpy`). Each call node's target is a
function of tensors (`on_tensors`): the tensors it is given become `torch._numpy` arrays, the
arrays it returns become their tensors again, so the AOT layer traces through it like any torch
function. What NumPy computes from an array's data in Python (`tolist()`, `item()`, truth) breaks
the graph, as for a tensor.
"""

from __future__ import annotations

import functools
import operator
import sys
import types
import warnings
from typing import Any, Callable, Sequence

import torch
from torch import fx
from torch.utils._pytree import tree_map

from kiln.capture.break_records import unsupported
from kiln.capture.user_exceptions import raise_real
from kiln.capture.variables.base import RealValueVariable, Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.wrapping import wrap_constant_result


def numpy() -> Any:
    """The numpy module where the user's program imported it (kiln never imports it itself)."""
    return sys.modules.get("numpy")


def is_ndarray(value: Any) -> bool:
    np = numpy()
    return np is not None and type(value) is np.ndarray


@functools.cache
def _tnp() -> Any:
    import torch._numpy as tnp
    from torch._numpy import _dtypes_impl

    if _dtypes_impl._default_dtypes is None:
        # NumPy's own defaults (float64, complex128, int64), set here: left unset, torch._numpy
        # reads them from Dynamo's config module, importing Dynamo into kiln's process.
        _dtypes_impl._default_dtypes = _dtypes_impl.DefaultDTypes(
            float_dtype=torch.float64, complex_dtype=torch.complex128, int_dtype=torch.int64)
    return tnp


def numpy_counterpart(value: Any) -> Callable | None:
    """The `torch._numpy` function for a NumPy function or ufunc (`np.add`, `np.linalg.norm`), or
    None. Not np.random's: NumPy's random stream stays NumPy's (such a call breaks the graph)."""
    np = numpy()
    if np is None or not (isinstance(value, (types.FunctionType, types.BuiltinFunctionType, np.ufunc))
                          or type(value).__module__ == "numpy" and type(value).__name__ == "_ArrayFunctionDispatcher"):
        return None
    name = getattr(value, "__name__", None)
    for module in ("", "linalg", "fft"):
        np_module = getattr(np, module) if module else np
        if isinstance(name, str) and getattr(np_module, name, None) is value:
            tnp_module = getattr(_tnp(), module) if module else _tnp()
            counterpart = getattr(tnp_module, name, None)
            return counterpart if callable(counterpart) else None
    return None


# --- the graph's targets: functions of tensors -------------------------------------------------------


def _as_array(value: Any) -> Any:
    return _tnp().ndarray(value) if isinstance(value, torch.Tensor) else value


def _as_tensor(value: Any) -> Any:
    return value.tensor if isinstance(value, _tnp().ndarray) else value


# Operators that write their left operand (and return it).
_IN_PLACE = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
             operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift,
             operator.imatmul, operator.setitem}


@functools.cache
def on_tensors(fn: Callable, name: str) -> Callable:
    """`fn` (a `torch._numpy` function, an operator, an array method) as a graph node's target: its
    tensor arguments as arrays, its arrays returned as tensors. `name` names it in graph code."""
    def run(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = tree_map(_as_array, (args, kwargs))
        return tree_map(_as_tensor, fn(*args, **kwargs))

    run.__name__ = run.__qualname__ = f"numpy_{name}"
    run.writes_in_place = fn in _IN_PLACE  # (output_graph.writes_in_place reads it)
    return run


@functools.cache
def _method_target(name: str) -> Callable:
    def call(array: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(array, name)(*args, **kwargs)

    return on_tensors(call, f"ndarray_{name}")


@functools.cache
def _attribute_target(name: str) -> Callable:
    return on_tensors(operator.attrgetter(name), f"ndarray_{name}")


def ndarray_of(tensor: torch.Tensor) -> Any:
    """A graph's output tensor as the ndarray the user's code made (sharing its memory)."""
    return tensor.numpy(force=True)


def tensor_of(array: Any) -> torch.Tensor:
    """An ndarray input as the graph reads it: its memory as a tensor. A read-only array's too,
    without torch's warning that writing it is undefined: the graph's writes are the user's code's,
    which NumPy itself would have refused."""
    if array.flags.writeable:
        return torch.from_numpy(array)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


# --- arguments ---------------------------------------------------------------------------------------


def _dtype_name(value: Any) -> str | None:
    """A dtype given to NumPy (np.float32, np.dtype("int32"), float, "int64") as the name
    `torch._numpy` takes, which a graph can hold; None for anything else."""
    np = numpy()
    if np is None or isinstance(value, str) or not (isinstance(value, (type, np.dtype))):
        return None
    if isinstance(value, type) and not (issubclass(value, np.generic) or value in (bool, int, float, complex)):
        return None
    try:
        return np.dtype(value).name
    except TypeError:  # (an abstract type: np.integer, np.floating)
        return None


def _argument(tx: Any, var: Variable) -> Variable:
    """`var` as a `torch._numpy` call's argument: a tensor as it is (the call makes it an array), a
    dtype by its name, containers item by item."""
    from kiln.capture.variables.containers import ListVariable, TupleVariable
    from kiln.capture.variables.tensor import TensorVariable

    if isinstance(var, (NumpyArrayVariable, TensorVariable)):
        return var
    if isinstance(var, (ListVariable, TupleVariable)) and type(var) in (ListVariable, TupleVariable):
        return type(var)([_argument(tx, item) for item in var.items])
    real = getattr(var, "value", None) if isinstance(var, RealValueVariable) else None
    name = _dtype_name(real) if real is not None else None
    return ConstantVariable(name) if name is not None else var


def _has_array(var: Variable) -> bool:
    from kiln.capture.variables.containers import BaseSequenceVariable
    from kiln.capture.variables.tensor import TensorVariable

    if isinstance(var, (NumpyArrayVariable, TensorVariable)):
        return True
    return isinstance(var, BaseSequenceVariable) and any(_has_array(item) for item in var.items)


def arrays_of(result: Variable) -> Variable:
    """A `torch._numpy` call's result: its tensors as the arrays they are."""
    from kiln.capture.variables.containers import ListVariable, TupleVariable
    from kiln.capture.variables.tensor import TensorVariable

    if isinstance(result, TensorVariable):
        return NumpyArrayVariable(result.node, result.example)
    if type(result) in (ListVariable, TupleVariable):
        return type(result)([arrays_of(item) for item in result.items])
    return result


def call_numpy(tx: Any, fn: Callable, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
    """`fn(*args, **kwargs)` in the graph, NumPy's way (`on_tensors`)."""
    args = [_argument(tx, a) for a in args]
    kwargs = {k: _argument(tx, v) for k, v in kwargs.items()}
    return arrays_of(tx.output.call("call_function", on_tensors(fn, name), args, kwargs))


# --- the variables -----------------------------------------------------------------------------------


# Read from the fake tensor's array: fixed by the input's guards.
_STATIC_ATTRS = {"shape", "ndim", "size", "dtype", "itemsize", "nbytes", "strides"}
# Methods that hand the data to Python.
_DATA_DEPENDENT = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "tobytes"}


class NumpyArrayVariable(Variable):
    """An ndarray: the fx node of its data's tensor and the fake tensor that carries its metadata."""

    def __init__(self, node: fx.Node, example: torch.Tensor, source: Any = None) -> None:
        super().__init__(source)
        self.node, self.example = node, example

    def python_type(self) -> type:
        return numpy().ndarray

    def describe(self) -> str:
        return f"ndarray {self.node.name} {tuple(self.example.shape)} {self.example.dtype}"

    def as_fx_arg(self) -> Any:
        return self.node

    def as_example(self) -> Any:
        return self.example

    def as_tensor(self) -> Variable:
        """The tensor this array's memory is (`torch.from_numpy`)."""
        from kiln.capture.variables.tensor import TensorVariable

        return TensorVariable(self.node, self.example)

    def getattr(self, tx: Any, name: str) -> Variable:
        if name in _STATIC_ATTRS:
            value = getattr(_tnp().ndarray(self.example), name)
            if name == "dtype":
                value = numpy().dtype(value.name)
            elif name == "shape":
                value = tuple(value)
            return wrap_constant_result(value)
        if name == "__class__":
            return wrap_constant_result(numpy().ndarray)
        if callable(getattr(numpy().ndarray, name, None)):
            return NumpyMethodVariable(self, name)
        if not hasattr(_tnp().ndarray, name):
            raise unsupported("unsupported_attribute", f"reading ndarray.{name} inside a compiled function")
        return arrays_of(tx.output.call("call_function", _attribute_target(name), [self], {}))

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name in _DATA_DEPENDENT:
            if tx.output.scalar_outputs and name in ("tolist", "item") and not args and not kwargs:
                from kiln.capture.variables import unbacked

                return unbacked.read(tx, self.as_tensor(), name)  # (an array's items are Python numbers too)
            raise unsupported("data_dependent", f"ndarray.{name}() reads array data while capturing",
                              "the graph breaks here; keep the value an array, or move this out of the compiled code")
        if not callable(getattr(_tnp().ndarray, name, None)):
            raise unsupported("unsupported_call", f"ndarray.{name}() inside a compiled function")
        args = [_argument(tx, a) for a in args]
        kwargs = {k: _argument(tx, v) for k, v in kwargs.items()}
        return arrays_of(tx.output.call("call_function", _method_target(name), [self, *args], kwargs))

    def iterate(self, tx: Any) -> list[Variable]:
        if self.example.dim() == 0:
            raise raise_real(TypeError("iteration over a 0-d array"))
        return [arrays_of(tx.output.call("call_function", on_tensors(operator.getitem, "getitem"),
                                         [self, ConstantVariable(i)], {}))
                for i in range(self.length(tx))]

    def length(self, tx: Any) -> int:
        if self.example.dim() == 0:
            raise raise_real(TypeError("len() of unsized object"))
        return int(self.example.shape[0])

    def truth(self, tx: Any) -> bool:
        raise unsupported("data_dependent_branch", f"the truth value of {self.describe()} decides Python control flow",
                          "the graph breaks at the branch; use np.where, or keep the branch outside the compiled code")

    def setattr(self, tx: Any, name: str, value: Variable) -> None:
        raise unsupported("unsupported_setattr", f"setting ndarray attribute {name!r} inside a compiled function")


class NumpyMethodVariable(Variable):
    """`a.sum` before it is called."""

    def __init__(self, array: NumpyArrayVariable, name: str) -> None:
        super().__init__(None)
        self.array, self.name = array, name

    def python_type(self) -> type:
        return type(getattr(numpy().ndarray(0), self.name))

    def describe(self) -> str:
        return f"method ndarray.{self.name}"

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return self.array.call_method(tx, self.name, args, kwargs)


class NumpyFunctionVariable(RealValueVariable):
    """A NumPy function or ufunc (`np.add`, `np.where`, `np.linalg.norm`): over arrays, a graph
    call of its `torch._numpy` counterpart; over constants only, NumPy's own answer where that is
    no array (`np.issubdtype(int, np.integer)`)."""

    def describe(self) -> str:
        return f"numpy function {getattr(self.value, '__name__', self.value)}"

    def truth(self, tx: Any) -> bool:
        return True

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if not any(_has_array(a) for a in [*args, *kwargs.values()]):
            constant = self._on_constants(args, kwargs)
            if constant is not None:
                return constant
        stacked = self._array_of_arrays(tx, args, kwargs)
        if stacked is not None:
            return stacked
        counterpart = numpy_counterpart(self.value)
        module = getattr(self.value, "__module__", None) or "numpy"
        prefix = "" if module == "numpy" else module.rpartition(".")[2] + "_"
        return call_numpy(tx, counterpart, prefix + self.value.__name__, args, kwargs)

    def _array_of_arrays(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable | None:
        """`np.array([a, b])` of arrays: their stack (`torch._numpy` would read their data as
        Python numbers, which it cannot while capturing), converted to `dtype` where one is given."""
        from kiln.capture.variables.containers import ListVariable, TupleVariable
        from kiln.capture.variables.tensor import TensorVariable

        np = numpy()
        if self.value not in (np.array, np.asarray) or len(args) != 1 or set(kwargs) - {"dtype"}:
            return None
        items = args[0].items if type(args[0]) in (ListVariable, TupleVariable) else []
        if not items or not all(isinstance(item, (NumpyArrayVariable, TensorVariable)) for item in items):
            return None
        stacked = call_numpy(tx, _tnp().stack, "stack", [TupleVariable(list(items))], {})
        return stacked if "dtype" not in kwargs else stacked.call_method(tx, "astype", [kwargs["dtype"]], {})

    def _on_constants(self, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable | None:
        """NumPy's result on constant arguments, where it is no array (an array is made in the
        graph instead: the graph's output is a new array each call, as NumPy's would be)."""
        try:
            real_args = [a.as_constant() for a in args]
            real_kwargs = {k: v.as_constant() for k, v in kwargs.items()}
        except Exception:  # noqa: BLE001 - an argument with no constant value: traced
            return None
        try:
            result = self.value(*real_args, **real_kwargs)
        except Exception as error:  # noqa: BLE001 - NumPy's own error, raised in the user's code
            raise raise_real(error) from None
        if isinstance(result, (numpy().ndarray, tuple, list)):
            return None
        return wrap_constant_result(result)


def numpy_binary(tx: Any, fn: Callable, a: Variable, b: Variable) -> Variable:
    """`fn(a, b)` for an operator with an array operand. With a tensor on the other side, the
    tensor's operator wins (torch.Tensor's `__array_priority__`): the array is its tensor."""
    from kiln.capture.variables.tensor import TensorVariable

    if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
        a, b = (v.as_tensor() if isinstance(v, NumpyArrayVariable) else v for v in (a, b))
        return tx.output.call("call_function", fn, [a, b], {})
    return call_numpy(tx, fn, fn.__name__, [a, b], {})


def numpy_unary(tx: Any, fn: Callable, a: NumpyArrayVariable) -> Variable:
    return call_numpy(tx, fn, fn.__name__, [a], {})


def numpy_subscript(tx: Any, array: NumpyArrayVariable, key: Variable) -> Variable:
    return call_numpy(tx, operator.getitem, "getitem", [array, key], {})


def numpy_store_subscript(tx: Any, array: NumpyArrayVariable, key: Variable, value: Variable) -> None:
    call_numpy(tx, operator.setitem, "setitem", [array, key, value], {})
