"""kiln's own capture in front of a backend, for functions and nn.Modules: what `kiln.compile`
(the door, kiln/api.py) returns."""

from __future__ import annotations

import functools
import threading
import types
from typing import Any, Callable

from torch import nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

from kiln import config
from kiln.capture import break_records
from kiln.capture.binder import make_binder
from kiln.capture.cache import FrameCache, reset_all
from kiln.capture.hf_generation import generation_helpers
from kiln.capture.hf_greedy import decoding_loop_kwargs


# kiln.compile's options that are settings for this function alone, by option name.
SETTING_OPTIONS = {"trace": "debug.trace_dir", "fp32_gemm": "backend.fp32_gemm"}


def _with_options(cache: FrameCache, options: dict) -> Callable:
    """What a call of the compiled function runs: its frame cache, under the settings that
    `kiln.compile`'s options give this function alone (`trace`: `debug.trace_dir`, the HTML
    compile report; `fp32_gemm`: `backend.fp32_gemm`, bfloat16 fast math), entered around each
    call so compilation and first runs see them. Without such options the cache itself, so a call
    costs nothing more."""
    changes = {name: str(options[option]) for option, name in SETTING_OPTIONS.items() if options.get(option) is not None}
    if not changes:
        return cache
    settings = config.patch(changes)

    def call(*args: Any, **kwargs: Any) -> Any:
        with settings:
            return cache(*args, **kwargs)

    return call


def _module_call(self, *args, **kwargs):
    # The frame kiln captures for a compiled module: nn.Module.__call__ with its hooks, inlined.
    return self(*args, **kwargs)


def _calling(fn: Callable) -> types.FunctionType:
    """A Python function that calls `fn`, a callable written in C: the frame kiln captures."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    call.__qualname__ = call.__name__ = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return call


def compiled_function(fn: Callable, backend: Callable, fullgraph: bool, options: dict, dynamic: bool | None = None) -> types.FunctionType:
    """What `kiln.compile(fn)` returns: a Python function called like `fn` (as torch.compile's is:
    `inspect.isfunction`, method binding and `torch.fx.symbolic_trace` take it), its frame cache
    as `kiln_cache`. Traced by torch.fx it raises, as Dynamo's does (FX would trace past kiln),
    unless the setting `capture.error_on_fx_trace` is off: then FX traces `fn` itself."""
    target, bound_self = fn, None
    if isinstance(fn, types.MethodType):
        target, bound_self = fn.__func__, fn.__self__
    elif not isinstance(fn, types.FunctionType) and callable(fn) and not isinstance(fn, type):
        call = getattr(type(fn), "__call__", None)
        if isinstance(call, types.FunctionType) and not type(fn).__module__.startswith("torch"):  # a user's callable object
            target, bound_self = call, fn
        else:  # a builtin (torch.sin), an ATen op: called from a function of kiln's own
            target = _calling(fn)
    if not isinstance(target, types.FunctionType):
        raise TypeError(f"kiln.compile: expected a callable (a Python function, method, nn.Module, builtin or "
                        f"an object with __call__), got {type(fn).__name__}")
    binder = make_binder(target)
    if bound_self is not None:
        binder = functools.partial(binder, bound_self)
    cache = FrameCache(target, binder, fn, backend, fullgraph, target.__qualname__, options.get("recompile_limit"), dynamic)
    run = _with_options(cache, options)

    def compiled(*args: Any, **kwargs: Any) -> Any:
        if is_fx_symbolic_tracing():
            return _under_fx_trace(fn, args, kwargs)
        return run(*args, **kwargs)

    functools.update_wrapper(compiled, fn)
    compiled.kiln_cache = cache  # type: ignore[attr-defined]
    return compiled


def is_compiled_function(value: Any) -> bool:
    """Whether `value` is what `kiln.compile(fn)` returned."""
    return isinstance(value, types.FunctionType) and "kiln_cache" in value.__dict__ and hasattr(value, "__wrapped__")


def _under_fx_trace(fn: Callable, args: tuple, kwargs: dict) -> Any:
    if config.capture.error_on_fx_trace:
        raise RuntimeError("Detected that you are using FX to symbolically trace a function kiln.compile made: FX "
                           "would record the original function's ops, past kiln. Trace the original function, or turn "
                           "off the setting capture.error_on_fx_trace (KILN_ERROR_ON_FX_TRACE=0) to let FX trace it.")
    return fn(*args, **kwargs)


class ForwardRoute:
    """While a method of the original module runs through `kiln.compile(module)` (`compiled.generate(...)`),
    the original's `forward` is the compiled one: HuggingFace's `generate` calls `self(**inputs)` on
    the original module, which without this would run eagerly and silently lose all of kiln's speed
    (as `torch.compile(model).generate()` does). The original's instance dict holds the compiled
    forward only for the method's duration (nested and concurrent calls share one installation)
    and then what it held before; written into the dict directly, so no module-structure guard
    moves. The forward compiled is the original's own: its class's method, or one the user set on
    the instance (compiled once per such function).

    Beside it, for the same duration, the helpers `generation_helpers` names for a HuggingFace
    generation model (kiln/capture/hf_generation.py: the static cache's masks left to the compiled
    forward, HF's own torch.compile of the forward turned off), each where the instance dict had
    no entry of that name; and a greedy or sampling `generate` runs kiln's decoding loop
    (kiln/capture/hf_greedy.py)."""

    _MISSING = object()

    def __init__(self, module: nn.Module, compile_forward: Callable[[Callable], Callable]) -> None:
        self.module, self.compile_forward = module, compile_forward
        self.lock = threading.Lock()
        self.depth = 0
        self.saved: Any = self._MISSING
        self.compiled: tuple[Any, Callable] | None = None  # (the forward it compiles, the compiled forward)
        self.helpers: dict[str, Callable] = {}  # what _enter put in the instance dict besides forward

    def method(self, method: types.MethodType) -> Callable:
        route = self

        generate = method.__name__ == "generate"

        @functools.wraps(method)
        def routed(*args: Any, **kwargs: Any) -> Any:
            route._enter()
            try:
                if generate:
                    kwargs = decoding_loop_kwargs(route.module, args, kwargs)
                return method(*args, **kwargs)
            finally:
                route._exit()

        return routed

    def _enter(self) -> None:
        with self.lock:
            if self.depth == 0:
                state = self.module.__dict__
                self.saved = state.get("forward", self._MISSING)
                source = type(self.module).forward if self.saved is self._MISSING else self.saved
                if self.compiled is None or self.compiled[0] is not source:
                    forward = types.MethodType(source, self.module) if self.saved is self._MISSING else source
                    self.compiled = (source, self.compile_forward(forward))
                state["forward"] = self.compiled[1]
                self.helpers = {name: helper for name, helper in generation_helpers(self.module).items()
                                if name not in state}
                state.update(self.helpers)
            self.depth += 1

    def _exit(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                state = self.module.__dict__
                # (A method that set a forward of its own meanwhile, accelerate's hooks wrapping
                # the one they found, keeps it.)
                if self.compiled is not None and state.get("forward") is self.compiled[1]:
                    if self.saved is self._MISSING:
                        del state["forward"]
                    else:
                        state["forward"] = self.saved
                for name, helper in self.helpers.items():
                    if state.get(name) is helper:
                        del state[name]
                self.helpers, self.saved = {}, self._MISSING


def _delegate(name: str) -> Callable:
    def method(self, *args: Any, **kwargs: Any) -> Any:
        orig = self.__dict__["_orig_mod"]
        result = getattr(orig, name)(*args, **kwargs)
        return self if result is orig else result

    method.__name__ = name
    method.__doc__ = f"`{name}` of the original module."
    return method


_OWN = {"__init__", "__call__", "forward", "__getattr__", "__setattr__", "__delattr__", "__dir__", "__repr__",
        "_call_impl", "_wrapped_call_impl", "__getstate__", "__setstate__", "_get_name", "extra_repr", "_apply"}


class CompiledModule(nn.Module):
    """What `kiln.compile(module)` returns: behaves as the original module; calls are compiled.

    Attributes, parameters, `state_dict`, `train()`/`eval()`, `to()` and hooks are the original's
    (no `_orig_mod.` prefix in the state dict); calling it runs `nn.Module.__call__` of the
    original, forward hooks included, through kiln's capture.
    """

    def __init__(self, module: nn.Module, backend: Callable, fullgraph: bool, options: dict, dynamic: bool | None = None) -> None:
        nn.Module.__init__(self)
        self.__dict__["_orig_mod"] = module
        self.__dict__["_settings"] = (backend, fullgraph, options, dynamic)
        binder = functools.partial(make_binder(_module_call), module)
        label = type(module).__qualname__
        self.__dict__["_cache"] = FrameCache(_module_call, binder, module, backend, fullgraph, label, options.get("recompile_limit"), dynamic)
        self.__dict__["_run"] = _with_options(self.__dict__["_cache"], options)
        # (`capture`: a forward the user compiled already is compiled again from its original, with these settings.)
        self.__dict__["_forward_route"] = ForwardRoute(
            module, lambda fn: capture(fn, backend, fullgraph, dynamic=dynamic, options=options))

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        return self.__dict__["_run"](*args, **kwargs)

    def __reduce__(self) -> tuple:
        # torch.save / pickle: the original module, compiled again with the same settings when
        # loaded (compiled code is never saved; the backend must pickle, as a function does).
        return (CompiledModule, (self.__dict__["_orig_mod"], *self.__dict__["_settings"]))

    def forward(self, /, *args: Any, **kwargs: Any) -> Any:
        return self.__dict__["_run"](*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        orig = self.__dict__["_orig_mod"]
        value = getattr(orig, name)
        if type(value) is types.MethodType and value.__self__ is orig and not name.startswith("__"):
            # A method of the original's own (`generate`, a user's `predict`) calls `self(...)` on
            # the original module: through the wrapper, those calls run compiled too.
            return self.__dict__["_forward_route"].method(value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__dict__["_orig_mod"], name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self.__dict__["_orig_mod"], name)

    def __dir__(self) -> list[str]:
        return dir(self.__dict__["_orig_mod"])

    # Container protocols are looked up on the type, past __getattr__: the original answers
    # (an empty ModuleList is false; len() of a Linear raises as it does without kiln).
    def __bool__(self) -> bool:
        return bool(self.__dict__["_orig_mod"])

    def __len__(self) -> int:
        return len(self.__dict__["_orig_mod"])

    def __iter__(self) -> Any:
        return iter(self.__dict__["_orig_mod"])

    def __getitem__(self, key: Any) -> Any:
        return self.__dict__["_orig_mod"][key]

    def __contains__(self, item: Any) -> bool:
        return item in self.__dict__["_orig_mod"]

    def __repr__(self) -> str:
        return f"CompiledModule({self.__dict__['_orig_mod']!r})"

    @property
    def kiln_cache(self) -> FrameCache:
        return self.__dict__["_cache"]


for _name, _value in list(vars(nn.Module).items()):
    if callable(_value) and not _name.startswith("__") and _name not in _OWN:
        setattr(CompiledModule, _name, _delegate(_name))


def _set_training(self: CompiledModule, value: bool) -> None:
    orig = self.__dict__.get("_orig_mod")
    if orig is not None:  # nn.Module.__init__ sets `training` before the original is attached
        orig.training = value


CompiledModule.training = property(lambda self: self.__dict__["_orig_mod"].training, _set_training)  # type: ignore[assignment]


def capture(fn_or_module: Any, backend: Callable, fullgraph: bool = False, dynamic: bool | None = None,
            options: dict | None = None) -> Any:
    """`fn_or_module` wrapped so that its calls run through kiln's capture and `backend` (a
    callable `(gm, example_inputs) -> callable`). Arguments are checked by the door, `kiln.compile`
    (kiln/api.py); `explain` uses this directly with a backend that keeps the graphs.

    Example::

        f = capture(f, lambda gm, example_inputs: gm.forward)
    """
    options = options or {}
    # Compiling what kiln compiled compiles the original with these settings (the outer call's
    # win, as under Dynamo); the inner compiled object keeps its own.
    if isinstance(fn_or_module, CompiledModule):
        fn_or_module = fn_or_module.__dict__["_orig_mod"]
    elif is_compiled_function(fn_or_module):
        fn_or_module = fn_or_module.__wrapped__
    if isinstance(fn_or_module, nn.Module):
        return CompiledModule(fn_or_module, backend, fullgraph, options, dynamic)
    if not callable(fn_or_module):
        raise TypeError(f"kiln.compile: fn_or_module must be callable (a function, method, nn.Module, builtin or object with __call__), got {type(fn_or_module).__name__}")
    return compiled_function(fn_or_module, backend, fullgraph, options, dynamic)


capture.kiln_compile_door = True  # (called inside a capture: the function itself, inlined; torch_fns.py)


def reset() -> None:
    """Forget every compiled entry and recorded graph break; the next calls capture again.

    Example::

        kiln.reset()
    """
    reset_all()
    break_records.BREAKS.clear()
