"""`kiln.compile`: kiln's own capture in front of a backend, for functions and nn.Modules."""

from __future__ import annotations

import functools
import types
from typing import Any, Callable

from torch import fx, nn

from kiln.capture.binder import make_binder
from kiln.capture.cache import FrameCache, reset_all

BACKEND_NAMES = ("kiln", "aot_eager", "eager")
MODES = (None, "default", "max-autotune", "max-autotune-no-cudagraphs")
OPTIONS = ("recompile_limit",)


def _eager_backend(gm: fx.GraphModule, example_inputs: list) -> Callable:
    return gm.forward


def resolve_backend(backend: Any) -> Callable:
    if callable(backend):
        return backend
    if backend == "eager":
        return _eager_backend
    if backend == "aot_eager":
        from kiln.integrations.dynamo import kiln_aot_eager

        return kiln_aot_eager
    if backend == "kiln":
        from kiln.integrations.dynamo import kiln

        return kiln
    raise ValueError(f"kiln.compile: backend must be one of {', '.join(map(repr, BACKEND_NAMES))} or a callable "
                     f"(gm, example_inputs) -> callable; got {backend!r}")


def _check_arguments(fullgraph: Any, dynamic: Any, mode: Any, options: Any) -> dict:
    if not isinstance(fullgraph, bool):
        raise TypeError(f"kiln.compile: fullgraph must be True or False, got {fullgraph!r}")
    if dynamic not in (None, False, True):
        raise ValueError(f"kiln.compile: dynamic must be None, False or True, got {dynamic!r}")
    if mode not in MODES:
        if mode == "reduce-overhead":
            raise NotImplementedError("kiln.compile: mode='reduce-overhead' (CUDA graphs) is not supported yet; "
                                      "accepted now: None, 'default', 'max-autotune', 'max-autotune-no-cudagraphs'")
        raise ValueError(f"kiln.compile: mode must be one of None, 'default', 'reduce-overhead', 'max-autotune', "
                         f"'max-autotune-no-cudagraphs'; got {mode!r}")
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError(f"kiln.compile: options must be a dict or None, got {type(options).__name__}")
    unknown = [k for k in options if k not in OPTIONS]
    if unknown:
        raise ValueError(f"kiln.compile: unknown option {unknown[0]!r}; accepted options: {', '.join(OPTIONS)}")
    limit = options.get("recompile_limit")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ValueError(f"kiln.compile: options['recompile_limit'] must be a positive int, got {limit!r}")
    return options


def _with_autotune_mode(backend: Callable, mode: str) -> Callable:
    """`backend` compiling under autotune mode `mode` (the wider GEMM and convolution search)."""
    from kiln import config

    @functools.wraps(backend)
    def compile_graph(gm: fx.GraphModule, example_inputs: list) -> Callable:
        with config.patch({"backend.autotune": mode}):
            return backend(gm, example_inputs)

    return compile_graph


def _module_call(self, *args, **kwargs):
    # The frame kiln captures for a compiled module: nn.Module.__call__ with its hooks, inlined.
    return self(*args, **kwargs)


class CompiledFunction:
    """What `kiln.compile(fn)` returns: call it like `fn`."""

    def __init__(self, fn: Callable, backend: Callable, fullgraph: bool, options: dict, dynamic: bool | None = None) -> None:
        target, bound_self = fn, None
        if isinstance(fn, types.MethodType):
            target, bound_self = fn.__func__, fn.__self__
        if not isinstance(target, types.FunctionType):
            raise TypeError(f"kiln.compile: expected a Python function, method or nn.Module, got {type(fn).__name__}")
        binder = make_binder(target)
        if bound_self is not None:
            binder = functools.partial(binder, bound_self)
        self._cache = FrameCache(target, binder, fn, backend, fullgraph, target.__qualname__, options.get("recompile_limit"), dynamic)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._cache(*args, **kwargs)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        # A compiled function stored on a class binds like a method.
        return self if obj is None else functools.partial(self, obj)

    @property
    def kiln_cache(self) -> FrameCache:
        return self._cache


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
        binder = functools.partial(make_binder(_module_call), module)
        label = type(module).__qualname__
        self.__dict__["_cache"] = FrameCache(_module_call, binder, module, backend, fullgraph, label, options.get("recompile_limit"), dynamic)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__dict__["_cache"](*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.__dict__["_cache"](*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_orig_mod"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__dict__["_orig_mod"], name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self.__dict__["_orig_mod"], name)

    def __dir__(self) -> list[str]:
        return dir(self.__dict__["_orig_mod"])

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


def compile(fn_or_module: Any = None, *, backend: Any = "kiln", fullgraph: bool = False, dynamic: bool | None = None,
            mode: str | None = None, options: dict | None = None) -> Any:
    """Compile a function or nn.Module with kiln's own bytecode capture and the chosen backend.

    Example::

        model = kiln.compile(model)                      # kiln backend
        f = kiln.compile(f, backend="eager")             # capture only (debugging)

        @kiln.compile(fullgraph=True)
        def g(x): return x.sin() + 1
    """
    opts = _check_arguments(fullgraph, dynamic, mode, options)
    compiled_backend = resolve_backend(backend)
    if mode in ("max-autotune", "max-autotune-no-cudagraphs"):  # the same on CPU: no CUDA graphs either way
        compiled_backend = _with_autotune_mode(compiled_backend, "max-autotune")
    if fn_or_module is None:
        return functools.partial(compile, backend=backend, fullgraph=fullgraph, dynamic=dynamic, mode=mode, options=options)
    if isinstance(fn_or_module, nn.Module):
        return CompiledModule(fn_or_module, compiled_backend, fullgraph, opts, dynamic)
    if not callable(fn_or_module):
        raise TypeError(f"kiln.compile: fn_or_module must be a function, method or nn.Module, got {type(fn_or_module).__name__}")
    return CompiledFunction(fn_or_module, compiled_backend, fullgraph, opts, dynamic)


def reset() -> None:
    """Forget every compiled entry and recorded fallback; the next calls capture again.

    Example::

        kiln.reset()
    """
    from kiln.capture import breaks

    reset_all()
    breaks.BREAKS.clear()
