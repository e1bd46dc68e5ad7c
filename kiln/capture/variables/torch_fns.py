"""torch functions (graph nodes), and the torch callables kiln models itself: grad mode and
autocast contexts, `is_compiling`, `torch.Size`/`torch.device`, global-state queries.

Any torch function or tensor method called with graph values becomes one node; the AOT layer
traces it further to ATen. torch's own Python code for nn.Module internals is inlined instead
(it is user-level Python, like any library's).
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.amp import autocast_mode
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from kiln.capture.break_records import Unsupported, unsupported
from kiln.capture.guards import ALWAYS_GUARDED, GLOBAL_STATE_READERS, Guard
from kiln.capture.markers import graph_break
from kiln.capture.reentry import ReenteredAutocast, set_autocast_state
from kiln.capture.user_exceptions import raise_real
from kiln.capture.variables.base import BoundBuiltinMethod, RealValueVariable, Variable
from kiln.capture.variables.builtins import constant_fold
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.containers import SizeVariable
from kiln.capture.variables.modules import ModuleCallVariable
from kiln.capture.variables.numpy_arrays import NumpyArrayVariable
from kiln.capture.variables.symbolic import SymNodeVariable
from kiln.capture.variables.tensor import TensorVariable

# torch Python functions that are operators (traced by the AOT layer), not torch internals.
# torch.masked's ops are defined in torch.masked._ops (their helpers build classes at run time).
_GRAPH_MODULES = ("torch", "torch.functional", "torch.nn.functional", "torch._tensor", "torch.special", "torch.fft",
                  "torch.linalg", "torch.random", "torch.nested", "torch._refs", "torch.masked", "torch.masked._ops",
                  "torch._decomp")
_STATEFUL_NAMES = ("set_", "_set_", "manual_seed", "seed", "use_deterministic", "initial_seed", "set_num_threads")


def is_torch_callable(value: Any) -> bool:
    if isinstance(value, type) or not callable(value):
        return False
    if isinstance(value, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        owner = getattr(value, "__objclass__", None)
        return owner is not None and issubclass(owner, torch._C.TensorBase)
    module = getattr(value, "__module__", None) or ""
    if isinstance(value, types.FunctionType):
        return module in _GRAPH_MODULES
    if isinstance(value, types.BuiltinFunctionType):
        return module.startswith("torch") or getattr(value, "__self__", None) in _TORCH_C_NAMESPACES
    return isinstance(value, torch._ops.OpOverloadPacket) or isinstance(value, torch._ops.OpOverload)


# The torch functions that make a tensor of an ndarray.
_FROM_NDARRAY = (torch.from_numpy, torch.as_tensor, torch.asarray, torch.tensor)

_TORCH_C_NAMESPACES = {torch._C._VariableFunctions, torch._C._nn, torch._C._fft, torch._C._linalg, torch._C._special}


def _holds_graph_values(data: Variable) -> bool:
    """Whether nested lists/tuples hold a tensor or a symbolic number (values of the graph)."""
    if isinstance(data, (TensorVariable, SymNodeVariable)):
        return True
    items = getattr(data, "items", None)
    return isinstance(items, list) and data.python_type() in (list, tuple) and any(_holds_graph_values(i) for i in items)


class TorchFunctionVariable(RealValueVariable):
    def describe(self) -> str:
        return f"torch function {getattr(self.value, '__qualname__', None) or getattr(self.value, '__name__', self.value)}"

    def truth(self, tx: Any) -> bool:
        return True  # (a function, builtin or not: `if self.activation:` on F.relu)

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        name = getattr(self.value, "__name__", "")
        if name.startswith(_STATEFUL_NAMES):
            raise unsupported("unsupported_call", f"{self.describe()} changes global state while capturing",
                              "call it outside the compiled function")
        if isinstance(self.value, (types.MethodDescriptorType, types.WrapperDescriptorType)):
            return args[0].call_method(tx, name, list(args[1:]), kwargs)
        if any(isinstance(a, NumpyArrayVariable) for a in args):
            return self._from_ndarray(tx, args, kwargs)
        if self.value is torch.tensor and args and not isinstance(args[0], TensorVariable) and _holds_graph_values(args[0]):
            # `torch.tensor([x, n])` of tensors or symbolic numbers: torch's reference implementation,
            # which builds it from them by ops the graph holds (torch.tensor itself reads their data).
            return tx.output.call("call_function", torch._refs.tensor, list(args), kwargs)
        requires_grad = kwargs.get("requires_grad")
        if requires_grad is not None and requires_grad.is_constant() and requires_grad.as_constant():
            # A new leaf of the user's autograd graph (`torch.ones(2, requires_grad=True)`): made inside
            # a compiled graph it would be an intermediate without grad, so it is made outside.
            raise unsupported("unsupported_call", f"{self.describe()}(requires_grad=True) makes a leaf tensor that needs its .grad",
                              "the graph breaks here; make the tensor outside the compiled function")
        try:
            return tx.output.call("call_function", self.value, list(args), kwargs)
        except Unsupported as error:
            if error.kind != "unsupported_argument" or not isinstance(self.value, types.FunctionType):
                raise
        # A Python function of torch's given an object no graph can hold (an options dataclass, a
        # module): its body is captured instead, down to the ops that object parametrizes.
        from kiln.capture.variables.functions import UserFunctionVariable

        return UserFunctionVariable(self.value, self.source).call(tx, args, kwargs)

    def _from_ndarray(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        """A tensor made from an ndarray: `torch.from_numpy(a)` and `torch.as_tensor(a)` are the
        array's memory, `torch.tensor(a)` a copy (with a `dtype`, converted)."""
        array = args[0]
        if len(args) != 1 or not isinstance(array, NumpyArrayVariable) or self.value not in _FROM_NDARRAY:
            raise unsupported("unsupported_argument", f"{self.describe()} given an ndarray", "the graph breaks at this call")
        if set(kwargs) - {"dtype", "device"} or self.value is torch.from_numpy and kwargs:
            raise unsupported("unsupported_argument", f"{self.describe()} of an ndarray with {sorted(kwargs)}")
        tensor = array.as_tensor()
        if self.value is torch.tensor:
            return tx.output.call("call_method", "to", [tensor], {**kwargs, "copy": ConstantVariable(True)})
        return tx.output.call("call_method", "to", [tensor], kwargs) if kwargs else tensor

    def getattr(self, tx: Any, name: str) -> Variable:
        if name in ("__name__", "__qualname__", "__module__"):
            return ConstantVariable(getattr(self.value, name, None))
        if isinstance(self.value, torch._ops.OpOverloadPacket):  # torch.ops.aten.add.Tensor: an overload
            try:
                overload = getattr(self.value, name)
            except AttributeError as error:  # no such overload: the user's AttributeError, as in eager
                raise raise_real(error) from None
            if isinstance(overload, torch._ops.OpOverload):
                return TorchFunctionVariable(overload)
        return super().getattr(tx, name)


# --- grad mode and autocast -----------------------------------------------------------------------


class GradModeVariable(Variable):
    """`torch.no_grad()` / `enable_grad()` / `set_grad_enabled(b)`: switches grad mode in the graph."""

    def __init__(self, enabled: bool, cls: type, prior: bool | None = None) -> None:
        super().__init__(None)
        self.enabled, self.cls = enabled, cls
        self.prior = prior  # set_grad_enabled switches on construction; exit restores this

    def python_type(self) -> type:
        return self.cls

    def enter(self, tx: Any) -> Variable:
        if self.prior is None:
            self.prior = torch.is_grad_enabled()
            tx.set_grad_mode(self.enabled)
        return ConstantVariable(None)

    def exit(self, tx: Any) -> Variable:
        tx.set_grad_mode(self.prior)
        self.prior = None if self.cls is not torch.set_grad_enabled else self.prior
        return ConstantVariable(None)

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        """`torch.no_grad()(fn)`: `fn` run in this mode. Decorating undoes `set_grad_enabled`'s
        switch on construction, as torch does."""
        if len(args) != 1 or kwargs or args[0].is_constant():
            return super().call(tx, args, kwargs)
        if self.cls is torch.set_grad_enabled and self.prior is not None:
            tx.set_grad_mode(self.prior)
        return GradModeFunctionVariable(self.enabled, args[0])

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name == "__enter__":
            return self.enter(tx)
        if name == "__exit__":
            return self.exit(tx)
        if name == "clone":
            return GradModeVariable(self.enabled, self.cls)
        return super().call_method(tx, name, args, kwargs)

    def getattr(self, tx: Any, name: str) -> Variable:
        if name == "__class__":
            return TorchClassVariable(self.cls)
        if name in ("__enter__", "__exit__", "clone"):
            return BoundBuiltinMethod(self, name)
        return super().getattr(tx, name)


class GradModeFunctionVariable(Variable):
    """A function decorated with a grad mode (`torch.enable_grad()(f)`, `torch.no_grad(f)`): called,
    its body is traced in that mode, the caller's mode back after it."""

    def __init__(self, enabled: bool, fn: Variable) -> None:
        super().__init__(None)
        self.enabled, self.fn = enabled, fn

    def python_type(self) -> type:
        return types.FunctionType

    def describe(self) -> str:
        return f"{self.fn.describe()} under grad mode {self.enabled}"

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        prior = torch.is_grad_enabled()
        tx.set_grad_mode(self.enabled)
        try:
            return self.fn.call(tx, args, kwargs)
        finally:
            tx.set_grad_mode(prior)


class AutocastVariable(Variable):
    """`torch.autocast(device_type, dtype=..., enabled=...)`: entered and left as graph nodes."""

    def __init__(self, device_type: str, dtype: Any, enabled: bool, cache_enabled: Any) -> None:
        super().__init__(None)
        self.args = (device_type, dtype, enabled, cache_enabled)
        self.node: Any = None
        self.real: Any = None

    def python_type(self) -> type:
        return torch.autocast

    def block_state(self) -> tuple | None:
        """The CPU autocast state inside the block, (enabled, dtype); None on other devices."""
        device, dtype, enabled, _ = self.args
        return (enabled, dtype) if device == "cpu" else None

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name == "__enter__":
            self.real = autocast_mode._enter_autocast(*self.args)
            tx.output.pending_restores.append(("autocast", self.real))
            self.node = tx.output.graph.call_function(autocast_mode._enter_autocast, self.args)
            return ConstantVariable(None)
        if name == "__exit__":
            autocast_mode._exit_autocast(self.real)
            tx.output.pending_restores.remove(("autocast", self.real))
            tx.output.graph.call_function(autocast_mode._exit_autocast, (self.node,))
            return ConstantVariable(None)
        return super().call_method(tx, name, args, kwargs)


class ReenteredAutocastVariable(Variable):
    """An autocast block a resume function starts inside (kiln/capture/reentry.py): its
    `__exit__` restores the state from before the block, for real and in the graph."""

    def __init__(self, enabled: bool, dtype: Any, prior: tuple) -> None:
        super().__init__(None)
        self.enabled, self.dtype, self.prior = enabled, dtype, prior

    def python_type(self) -> type:
        return ReenteredAutocast

    def block_state(self) -> tuple:
        return (self.enabled, self.dtype)

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name == "__exit__":
            # The graph enters the outer state as a nested block, closed at the graph's end.
            set_autocast_state(self.prior)
            enabled, dtype = self.prior
            tx.output.open_autocast.append(tx.output.graph.call_function(autocast_mode._enter_autocast, ("cpu", dtype, enabled, None)))
            return ConstantVariable(False)
        return super().call_method(tx, name, args, kwargs)


def _autocast(tx: Any, device_type: Variable, dtype: Variable | None = None, enabled: Variable | None = None, cache_enabled: Variable | None = None) -> Variable:
    device = device_type.as_constant()
    dt = dtype.as_constant() if dtype is not None else torch.get_autocast_dtype(device)
    return AutocastVariable(device, dt, True if enabled is None else bool(enabled.as_constant()), None if cache_enabled is None else cache_enabled.as_constant())


def _cpu_autocast(tx: Any, enabled: Variable | None = None, dtype: Variable | None = None, cache_enabled: Variable | None = None) -> Variable:
    return _autocast(tx, ConstantVariable("cpu"), dtype, enabled, cache_enabled)


class TorchClassVariable(RealValueVariable):
    """A torch class or callable kiln builds itself (`torch.no_grad`, `torch.Size`, `torch.device`)."""

    def describe(self) -> str:
        return f"{getattr(self.value, '__qualname__', self.value)}"

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return _SPECIAL_CALLS[self.value](tx, *args, **kwargs)


def _global_state(tx: Any, item: str, value: Any) -> Variable:
    # Every capture guards these items' values on entry (kiln/capture/frame.py); what the traced
    # code reads later follows from them and the switches it made, so it needs no guard of its own
    # (one would check the value inside a block against the state on entry).
    return ConstantVariable(value)


def _read_state(item: str, tx: Any) -> Variable:
    """A process-wide setting the trace reads (the profiler's, inference mode's, the thread
    count): its value now, and a guard that it is the same on the next call."""
    value = GLOBAL_STATE_READERS[item]()
    tx.output.guards.add(Guard("GLOBAL_STATE", None, value, item))
    return ConstantVariable(value)


def _set_grad_enabled(tx: Any, mode: Variable) -> Variable:
    prior = torch.is_grad_enabled()
    tx.set_grad_mode(bool(mode.as_constant()))
    return GradModeVariable(bool(mode.as_constant()), torch.set_grad_enabled, prior)


def _size(tx: Any, items: Variable | None = None) -> Variable:
    # A tensor among the sizes is read as the int `operator.index` gives (torch.Size([t[0], 64])):
    # known where the tensor was made from constants; otherwise its value is the data's.
    sizes = [tx.output.known.as_index(item) for item in (items.iterate(tx) if items is not None else [])]
    if any(isinstance(size, TensorVariable) for size in sizes):
        raise unsupported("data_dependent", "torch.Size of a tensor's value reads the data")
    return SizeVariable(sizes)


def _fold(fn: Callable) -> Callable:
    def call(tx: Any, *args: Variable, **kwargs: Variable) -> Variable:
        return constant_fold(fn, args, kwargs)

    return call


def _is_tensor(tx: Any, x: Variable) -> Variable:
    return ConstantVariable(isinstance(x, TensorVariable))


def _is_tensor_like(tx: Any, x: Variable) -> Variable:
    """torch.overrides.is_tensor_like: a tensor, or anything with a `__torch_function__`."""
    return ConstantVariable(isinstance(x, TensorVariable) or x.hasattr(tx, "__torch_function__"))


# A tensor class whose __torch_function__ is one of these overrides nothing (nn.Parameter's is torch's disabled one).
_NOT_OVERRIDES = (inspect.getattr_static(torch.Tensor, "__torch_function__"), torch._C._disabled_torch_function_impl)


def _has_torch_function(tx: Any, *args: Variable) -> Variable:
    """torch.overrides.has_torch_function(_unary, _variadic): False for kiln's tensors; an object
    or tensor subclass with its own `__torch_function__` would send the call to it, which kiln does
    not trace (a break, not a wrong False)."""
    one_sequence = len(args) == 1 and not isinstance(args[0], TensorVariable) and issubclass(args[0].python_type(), (tuple, list))
    for item in args[0].iterate(tx) if one_sequence else args:
        if isinstance(item, TensorVariable):
            overrides = inspect.getattr_static(item.cls, "__torch_function__", None) not in _NOT_OVERRIDES
        else:
            overrides = not isinstance(item, ConstantVariable) and item.hasattr(tx, "__torch_function__")
        if overrides:
            raise unsupported("unsupported_call", f"{item.describe()} overrides torch functions (__torch_function__)",
                              "the graph breaks here; its __torch_function__ runs eagerly")
    return ConstantVariable(False)


def _false(*args: Any, **kwargs: Any) -> Variable:
    return ConstantVariable(False)


def _true(*args: Any, **kwargs: Any) -> Variable:
    return ConstantVariable(True)


def _none(*args: Any, **kwargs: Any) -> Variable:
    return ConstantVariable(None)


def _check(tx: Any, cond: Variable, *rest: Variable, **kwargs: Variable) -> Variable:
    if cond.is_constant() and not cond.as_constant():
        raise raise_real(RuntimeError("torch._check failed while capturing"))
    if isinstance(cond, SymNodeVariable) and free_unbacked_symbols(cond.value):
        # A fact about a number read from tensor data (capture.scalar_outputs): in the graph, so
        # that it is checked when the graph runs, and told to the shape environment now (which
        # then knows, e.g., that torch.arange(u0) has a size u0 >= 0).
        # (As ATen's assertion op, which the AOT layer's tracing keeps as a node of its graph.)
        tx.output.call("call_function", torch.ops.aten._assert_scalar.default,
                       [cond, ConstantVariable("Expected cond to be True, but got False.")], {})
    return ConstantVariable(None)


def _dynamo_disabled(*args: Any, **kwargs: Any) -> Variable:
    raise unsupported("disabled", "torch.compiler.disable()d code is not compiled")


_SPECIAL_CALLS: dict[Any, Callable[..., Variable]] = {
    torch.no_grad: lambda tx, fn=None: GradModeVariable(False, torch.no_grad) if fn is None else GradModeFunctionVariable(False, fn),
    torch.enable_grad: lambda tx, fn=None: GradModeVariable(True, torch.enable_grad) if fn is None else GradModeFunctionVariable(True, fn),
    torch.set_grad_enabled: _set_grad_enabled,
    torch._C._set_grad_enabled: lambda tx, mode: (_set_grad_enabled(tx, mode), ConstantVariable(None))[1],
    torch.autocast: _autocast,
    torch.amp.autocast: _autocast,
    torch.is_grad_enabled: lambda tx: _global_state(tx, "grad_enabled", torch.is_grad_enabled()),
    torch.get_default_dtype: lambda tx: _global_state(tx, "default_dtype", torch.get_default_dtype()),
    **{reader: functools.partial(_read_state, item) for item, reader in GLOBAL_STATE_READERS.items() if item not in ALWAYS_GUARDED},
    torch.is_autocast_enabled: lambda tx, *a: ConstantVariable(_global_state(tx, "autocast_cpu", (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))) and torch.is_autocast_enabled(*[x.as_constant() for x in a])),
    torch.compiler.is_compiling: _true,
    torch.compiler.is_dynamo_compiling: _false,
    torch.jit.is_scripting: _false,
    torch.jit.is_tracing: _false,
    torch._C._get_tracing_state: _none,
    torch.fx._symbolic_trace.is_fx_tracing: _false,
    torch.is_tensor: _is_tensor,
    torch.overrides.is_tensor_like: _is_tensor_like,
    torch.overrides.has_torch_function: _has_torch_function,
    torch.overrides.has_torch_function_unary: _has_torch_function,
    torch.overrides.has_torch_function_variadic: _has_torch_function,
    torch._check: _check,
    torch._assert: _check,
    torch.Size: _size,
    torch.device: _fold(torch.device),
    torch.finfo: _fold(torch.finfo),
    torch.iinfo: _fold(torch.iinfo),
    torch.promote_types: _fold(torch.promote_types),
}
if hasattr(torch.cpu.amp, "autocast"):
    _SPECIAL_CALLS[torch.cpu.amp.autocast] = _cpu_autocast


def special_callable(value: Any) -> Variable | None:
    """The variable for a torch callable kiln models itself, or None."""
    try:
        if value in _SPECIAL_CALLS:
            return TorchClassVariable(value)
    except TypeError:
        return None
    if isinstance(value, torch.no_grad) or isinstance(value, torch.enable_grad):
        return GradModeVariable(isinstance(value, torch.enable_grad), type(value))
    if isinstance(value, torch.autocast):
        return AutocastVariable(value.device, value.fast_dtype, value._enabled, value._cache_enabled)
    if value in _MODULE_CALLS:
        return ModuleCallVariable(value)
    if value is torch.cond or value is torch.ops.higher_order.cond:  # (the op itself, called directly: the same)
        from kiln.capture.variables.control_flow import CondVariable  # control_flow.py imports this module's neighbours

        return CondVariable()
    # Read from the function's own __dict__: `torch.ops` makes a namespace for any attribute name
    # it is asked for, and an object whose __getattr__ answers every name would read as disabled.
    fn = value.__func__ if isinstance(value, types.MethodType) else value
    own = getattr(fn, "__dict__", None) if isinstance(fn, types.FunctionType) else None
    if isinstance(own, dict) and own.get("_torchdynamo_disable") is True:
        return _Disabled(value)
    if is_graph_break_marker(value):
        return _BreakHere(value)
    if isinstance(own, dict) and own.get("kiln_compile_door") is True:  # (kiln.compile itself, by its own __dict__)
        return _CompileInside()
    return None


class _CompileInside(Variable):
    """`kiln.compile(fn, ...)` called inside a function kiln is capturing: `fn` itself, so that
    calling it inlines it into the graph being captured (as Dynamo inlines a nested torch.compile);
    without `fn` (the decorator form), a decorator that gives back what it decorates."""

    def python_type(self) -> type:
        return types.FunctionType

    def describe(self) -> str:
        return "kiln.compile inside a compiled function"

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        target = args[0] if args else kwargs.get("fn_or_module")
        if target is None or target.is_constant() and target.as_constant() is None:
            return self
        return target


def is_graph_break_marker(value: Any) -> bool:
    """Dynamo's `graph_break` (or kiln.graph_break): a call that asks for the graph to end there.
    Known by its module's name, so that Dynamo is not imported to compare with it."""
    if value is graph_break:
        return True
    return (isinstance(value, types.FunctionType)  # kiln-allow-torch-internal: a name compared, nothing imported
            and value.__module__ == "torch._dynamo.decorators"  # kiln-allow-torch-internal: the user's graph_break() call
            and value.__name__ == "graph_break")


class _BreakHere(RealValueVariable):
    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        who = "kiln" if self.value is graph_break else "torch._dynamo"  # kiln-allow-torch-internal: names the call in the record
        raise unsupported("graph_break", f"{who}.graph_break() asks for a graph break here",
                          "remove the call to capture one graph")


_MODULE_CALLS = {nn.Module.__call__, nn.Module._call_impl}


class _Disabled(Variable):
    def __init__(self, value: Any) -> None:
        super().__init__(None)
        self.value = value

    def python_type(self) -> type:
        return type(self.value)

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return _dynamo_disabled()
