"""A function with the user function's exact signature that returns its bound arguments as a tuple.

Python's own call machinery then does the argument binding (defaults, keywords, *args,
**kwargs, and the TypeError for a bad call) at C speed, which keeps guard checks cheap.
`argument_names` gives a code object's parameters in that binding order.
"""

from __future__ import annotations

import inspect
import types
from typing import Callable


def argument_names(code: types.CodeType) -> list[str]:
    """The frame's parameters in binding order: positional, keyword-only, *args, **kwargs."""
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    return list(code.co_varnames[:count])


def make_binder(fn: types.FunctionType) -> Callable[..., tuple]:
    code = fn.__code__
    # (a comprehension's code takes its iterator as ".0": positional, renamed here to be source)
    names = [n if n.isidentifier() else f"_kiln_argument_{i}" for i, n in enumerate(argument_names(code))]
    npos, nposonly, nkw = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
    params = list(names[:npos])
    if nposonly:
        params.insert(nposonly, "/")
    position = npos + nkw
    if code.co_flags & inspect.CO_VARARGS:
        params.append(f"*{names[position]}")
    elif nkw:
        params.append("*")
    params.extend(names[npos:npos + nkw])
    if code.co_flags & inspect.CO_VARKEYWORDS:
        params.append(f"**{names[-1]}")
    body = ", ".join(names) + ("," if len(names) == 1 else "")
    text = f"def bind({', '.join(params)}):\n    return ({body})\n"
    scope: dict = {}
    exec(compile(text, f"<kiln binder for {fn.__qualname__}>", "exec"), scope)
    binder = scope["bind"]
    binder.__qualname__ = fn.__qualname__  # a bad call's TypeError names the user's function
    binder.__defaults__ = fn.__defaults__
    binder.__kwdefaults__ = fn.__kwdefaults__
    return binder
