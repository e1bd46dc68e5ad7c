"""The special functions' one table (kiln/codegen/special_functions.py) against the code generators:
every special-function op has an entry, each entry is defined for the C++ printer and for the
Triton printer (or says why Triton has no code for it), and both printers print from the table.
Pure Python: nothing is compiled."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

from kiln.codegen import special_functions
from kiln.codegen.cpp.preamble import preamble
from kiln.codegen.cpp.printer import _BINARY as CPP_BINARY
from kiln.codegen.cpp.printer import _UNARY as CPP_UNARY
from kiln.codegen.special_functions import (FAMILIES, SPECIAL_FUNCTIONS, Libdevice, NotInTriton, SpecialFunction,
                                            TritonHelper, cpp_source, triton_source)
from kiln.codegen.triton.body import TritonBody, unprintable_ops
from kiln.codegen.triton.module import PREAMBLE
from kiln.codegen.triton.printer import BINARY as TRITON_BINARY
from kiln.codegen.triton.printer import UNARY as TRITON_UNARY
from kiln.ir.ops import SPECIAL_FUNCTION_BINARY_OPS, SPECIAL_FUNCTION_UNARY_OPS
from kiln.runtime.triton_math import INTERPRETER_LIBDEVICE

OPS = SPECIAL_FUNCTION_UNARY_OPS + SPECIAL_FUNCTION_BINARY_OPS


def _called(text: str) -> set[str]:
    return set(re.findall(r"\b(kiln_\w+)\(", text))


def _cpp_defines(text: str, name: str) -> bool:
    return re.search(rf"^(template <[^>]*> )?static inline [\w:<>]+ {name}\(", text, re.M) is not None


def _triton_defines(text: str, name: str) -> bool:
    return re.search(rf"^def {name}\(", text, re.M) is not None


def undefined(families=FAMILIES) -> list[str]:
    """What the table `families` leaves undefined: an op without an entry, or an entry whose
    C++ or Triton calls a function that neither its text nor libdevice's stand-ins define."""
    functions = {f.op: f for family in families for f in family.functions}
    found = [f"{op}: no entry" for op in OPS if op not in functions]
    cpp, triton = cpp_source(families), triton_source(families)
    for f in functions.values():
        found += [f"{f.op}: C++ calls {name}, defined nowhere" for name in _called(f.cpp_call)
                  if not _cpp_defines(cpp, name)]
        if isinstance(f.triton, Libdevice) and not hasattr(INTERPRETER_LIBDEVICE, f.triton.name):
            found.append(f"{f.op}: libdevice.{f.triton.name} has no stand-in under Triton's interpreter")
        if isinstance(f.triton, TritonHelper):
            # printed_by_body: what the body's method for the op prints.
            printed = inspect.getsource(getattr(TritonBody, f.op)) if f.triton.printed_by_body else f.triton_call
            found += [f"{f.op}: Triton calls {name}, defined nowhere" for name in _called(printed)
                      if not _triton_defines(triton, name)]
            if not _called(printed):
                found.append(f"{f.op}: Triton prints no helper")
    # What the helpers call in turn: each other, the module's general helpers, and libdevice.
    general = PREAMBLE.replace(triton_source(), "")
    found += [f"Triton helpers call {name}, defined nowhere" for name in _called(triton)
              if not _triton_defines(triton + general, name)]
    found += [f"Triton helpers call libdevice.{name}, which has no stand-in under Triton's interpreter"
              for name in set(re.findall(r"\blibdevice\.(\w+)\(", triton)) if not hasattr(INTERPRETER_LIBDEVICE, name)]
    return found


def test_every_special_function_is_defined_for_both_code_generators():
    assert sorted(SPECIAL_FUNCTIONS) == sorted(OPS)
    assert undefined() == []


def _changed(op: str, **change) -> tuple:
    """The table with `op`'s entry changed."""
    return tuple(dataclasses.replace(family, functions=tuple(dataclasses.replace(f, **change) if f.op == op else f
                                                             for f in family.functions)) for family in FAMILIES)


@pytest.mark.parametrize("families, message", [
    # an op of ir/ops.py without an entry
    (tuple(dataclasses.replace(family, functions=family.functions[1:]) for family in FAMILIES[:1]) + FAMILIES[1:],
     "digamma: no entry"),
    # C++ defined, Triton's helper missing
    (_changed("i0e", triton=TritonHelper("")), "i0e: Triton calls kiln_i0e, defined nowhere"),
    # Triton defined, C++ missing
    (_changed("zeta", cpp=special_functions.Cpp("decltype({1})(kiln_zeta(double({0}), double({1})))")),
     "zeta: C++ calls kiln_zeta, defined nowhere"),
    # a libdevice function the interpreter cannot run
    (_changed("erfinv", triton=Libdevice("no_such_function", lambda x: x)), "no stand-in"),
])
def test_a_function_missing_for_one_code_generator_is_caught(families, message):
    assert any(message in problem for problem in undefined(families))


@pytest.mark.parametrize("op", OPS)
def test_both_printers_print_the_tables_spelling(op):
    f = SPECIAL_FUNCTIONS[op]
    assert (CPP_UNARY if f.arity == 1 else CPP_BINARY)[op] == f.cpp_call
    triton = TRITON_UNARY if f.arity == 1 else TRITON_BINARY
    if f.triton_call is not None:
        assert triton[op] == f.triton_call
    else:
        assert op not in triton
        assert (op in unprintable_ops()) == isinstance(f.triton, NotInTriton)


def test_the_kernels_include_the_tables_definitions():
    assert cpp_source() in preamble()
    assert triton_source() in PREAMBLE
    # Nothing else defines a special function: a `kiln_<op>` helper is in the Triton preamble once,
    # and only where the table has it.
    for f in SPECIAL_FUNCTIONS.values():
        helper = isinstance(f.triton, TritonHelper) and not f.triton.printed_by_body
        assert len(re.findall(rf"^def kiln_{f.op}\(", PREAMBLE, re.M)) == helper, f.op


def test_an_entry_needs_both_definitions():
    # The table's entries cannot leave either side out: Triton's absence is stated with its reason.
    with pytest.raises(TypeError):
        SpecialFunction("digamma", special_functions.InDouble("x", "kiln_special::digamma(x)"))  # type: ignore[call-arg]
    assert all(f.triton.why for f in SPECIAL_FUNCTIONS.values() if isinstance(f.triton, NotInTriton))
