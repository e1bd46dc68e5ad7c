"""`os.environ` read by name: a guard on that one variable, not on the names of all of them.

`os.environ` is an `os._Environ`, a mapping whose methods read its `_data` dict. Traced as any
object, `os.environ.get("X", "0")` reads that dict whole, and a dict read from a constant is
guarded on its list of keys: setting any other variable later (Inductor compiling in the same
process, a tokenizer setting TOKENIZERS_PARALLELISM) then failed every entry, and each call that
read the environment compiled again. transformers' SDPA attention reads
TRANSFORMERS_SDPA_FORCE_GQA on every forward, so an HF model compiled by kiln recompiled its
prefill and decode step (Qwen2-0.5B: 4 s of a `generate`) after Inductor compiled another model.
Dynamo guards such a read on that key only (its dict guards are per key until the code needs all
of them); so does this variable, where nothing in the trace has touched the dict.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

from kiln.capture.guards import Guard
from kiln.capture.sources import InstanceDictSource, ItemSource
from kiln.capture.user_exceptions import raise_real
from kiln.capture.variables.base import BoundBuiltinMethod, Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.objects import UserObjectVariable


class EnvironVariable(UserObjectVariable):
    """`os.environ` (the real one, with a source): `get`, `[]` and `in` of a constant name read
    the variable now and guard whether it is set and, where it is, its value. Every other use
    (iteration, `len`, `copy`, a write), and any read once the trace has reached the `_data` dict
    another way, runs `os._Environ`'s own methods over the dict as the trace holds it."""

    _READS = ("get", "__getitem__", "__contains__")

    def is_constant(self) -> bool:
        # Never folded as a real object: its contents change, and a builtin computed on it now
        # (`len`, `dict(os.environ)`) would read them unguarded.
        return False

    def getattr(self, tx: Any, name: str) -> Variable:
        if name in self._READS:
            return BoundBuiltinMethod(self, name)
        return super().getattr(tx, name)

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        read = self._read_by_name(tx, name, args, kwargs)
        if read is not None:
            return read
        if name.startswith("__"):
            return super().call_method(tx, name, args, kwargs)
        return super().getattr(tx, name).call(tx, list(args), kwargs)  # (not this class's getattr: it returns here)

    def _read_by_name(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable | None:
        """The read as a constant, its key guarded; None where it is not one this variable answers."""
        if name not in self._READS or kwargs or not args or len(args) > (2 if name == "get" else 1):
            return None
        if not args[0].is_constant() or type(args[0].as_constant()) is not str:
            return None
        data = self.value.__dict__.get("_data")
        if type(data) is not dict or id(data) in tx.output.wrapped_containers:
            return None  # (the trace holds the dict: writes to it are pending there)
        key = self.value.encodekey(args[0].as_constant())
        data_source = ItemSource(InstanceDictSource(self.source), "_data")
        present = key in data
        tx.output.guards.add(Guard("DICT_CONTAINS", data_source, present, key))
        if present:
            tx.output.guards.add(Guard("EQUALS", ItemSource(data_source, key), data[key]))
        if name == "__contains__":
            return ConstantVariable(present)
        if present:
            return ConstantVariable(self.value.decodevalue(data[key]))
        if name == "get":
            return args[1] if len(args) == 2 else ConstantVariable(None)
        raise raise_real(KeyError(args[0].as_constant()))


def is_environ(value: Any) -> bool:
    return type(value) is os._Environ
