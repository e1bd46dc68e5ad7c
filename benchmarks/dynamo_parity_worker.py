"""One test file of Dynamo's test suite run in this process, under Dynamo or redirected to kiln.

    python -m benchmarks.dynamo_parity_worker FILE {dynamo,kiln} OUT.json [--timeout S]

Under `kiln`, Dynamo's entry points are replaced before the file is imported: `torch.compile`,
`torch._dynamo.optimize` and `optimize_assert` (every module's name for them, the test file's too)
compile with `kiln.compile` and the same backend (a test's counting backend stays its own; the
"inductor" default becomes kiln's backend), and `torch._dynamo.reset` resets kiln as well. Every
test of the file is run by unittest; for each, its outcome, where it failed and whether Dynamo
compiled anything during it (a test that reaches Dynamo by a path not redirected — export, a
context manager, `torch._dynamo.run` — is marked so and not counted for or against kiln). The
classification of failures is dynamo_parity.py's.

Old tests (torchdynamo's own repository, before it moved into PyTorch) import `torchdynamo`:
the name is an alias of `torch._dynamo` here, its submodules too.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import enum
import json
import linecache
import os
import re
import signal
import sys
import time
import traceback
import types
import unittest
from pathlib import Path
from typing import Any, Callable

ALIASES = {"torchdynamo": "torch._dynamo", "torchinductor": "torch._inductor"}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import torchdynamo.testing` gives torch._dynamo.testing (the module itself, not a copy)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        head = name.split(".")[0]
        if head not in ALIASES:
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        head, _, rest = spec.name.partition(".")
        module = importlib.import_module(ALIASES[head] + ("." + rest if rest else ""))
        if spec.name == "torchdynamo.testing" and not hasattr(module, "requires_static_shapes"):
            # (a decorator the old tests import that PyTorch's Dynamo has since dropped: it skipped
            # a test under dynamic shapes, which neither mode here turns on)
            module.requires_static_shapes = _identity
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class NotRedirected(Exception):
    """A use of Dynamo's API that the harness does not give to kiln."""


def _kiln_backend(backend: Any) -> Any:
    """The backend kiln.compile gets for a backend a test gave Dynamo."""
    if callable(backend):
        return backend
    if backend in (None, "inductor"):
        return "kiln"
    if backend in ("eager", "aot_eager", "kiln"):
        return backend
    from torch._dynamo.backends.registry import lookup_backend

    return lookup_backend(backend)  # another of Dynamo's named backends, as a callable of (gm, inputs)


class _KilnOptimize:
    """What torch._dynamo.optimize(...) returns, for kiln: a decorator (not a context manager)."""

    def __init__(self, backend: Any, fullgraph: bool, dynamic: Any) -> None:
        self.backend, self.fullgraph, self.dynamic = backend, fullgraph, dynamic

    def __call__(self, fn: Callable) -> Any:
        import kiln

        if _AS_EAGER:
            return fn
        dynamic = self.dynamic if self.dynamic in (None, True, False) else None
        return kiln.compile(fn, backend=_kiln_backend(self.backend), fullgraph=self.fullgraph, dynamic=dynamic)

    def __enter__(self) -> None:
        raise NotRedirected("torch._dynamo.optimize(...) as a context manager")

    def __exit__(self, *exc: Any) -> None:
        return None


# The "eager" mode: the test's compiled functions are the functions themselves. A test that fails
# so, at the line where it fails under kiln, asserts Dynamo's own semantics (a value eager does
# not give), which kiln, giving eager's, need not match.
_AS_EAGER = False


def _identity(fn: Callable) -> Callable:
    return fn


def redirect_to_kiln() -> dict[int, tuple[Callable, Callable]]:
    """Dynamo's entry points replaced by kiln's; returns {id(original): (original, replacement)},
    for `rebind` to find other modules' names of them."""
    import torch
    import torch._dynamo
    import torch._dynamo.eval_frame as eval_frame
    import torch._dynamo.test_case  # noqa: F401 (imported so that its names are rebound too)
    import torch._dynamo.testing  # noqa: F401

    import kiln

    original_reset = torch._dynamo.reset

    def optimize(*args: Any, **kwargs: Any) -> Any:
        backend = args[0] if args else kwargs.get("backend", "inductor")
        if kwargs.get("disable"):
            return _identity
        return _KilnOptimize(backend, bool(kwargs.get("nopython", False)), kwargs.get("dynamic"))

    def optimize_assert(*args: Any, **kwargs: Any) -> Any:
        backend = args[0] if args else kwargs.get("backend", "inductor")
        if kwargs.get("export"):
            raise NotRedirected("torch._dynamo.optimize_assert(export=True)")
        return _KilnOptimize(backend, True, kwargs.get("dynamic"))

    def compile(model: Any = None, *, fullgraph: bool = False, dynamic: Any = None, backend: Any = "inductor",
                mode: Any = None, options: Any = None, disable: bool = False, **_: Any) -> Any:
        if disable:
            return model if model is not None else _identity
        decorator = _KilnOptimize(backend, bool(fullgraph), dynamic)
        return decorator if model is None else decorator(model)

    def reset() -> None:
        original_reset()
        kiln.reset()

    def run(fn: Any = None) -> Any:
        raise NotRedirected("torch._dynamo.run (runs only what Dynamo has compiled)")

    replacements = {
        "optimize": (eval_frame.optimize, optimize),
        "optimize_assert": (eval_frame.optimize_assert, optimize_assert),
        "compile": (torch.compile, compile),
        "reset": (original_reset, reset),
        "run": (getattr(torch._dynamo, "run", None), run),
    }
    # (the originals kept in the map: once no module names them, a freed original's id could be
    # taken by a test's own function)
    by_object = {id(old): (old, new) for old, new in replacements.values() if old is not None}
    for name, module in list(sys.modules.items()):
        if name == "torch" or name.startswith("torch._dynamo"):
            rebind(module, by_object)
    return by_object


def rebind(module: Any, by_object: dict[int, tuple[Callable, Callable]]) -> None:
    """Every name in `module` bound to one of the replaced functions, bound to its replacement."""
    namespace = getattr(module, "__dict__", None)
    if not isinstance(namespace, dict):
        return
    for key, value in list(namespace.items()):
        old, new = by_object.get(id(value), (None, None))
        if old is value:
            namespace[key] = new


class _CountingBreaks(list):
    """kiln's list of break records, counting every record ever added (kiln.reset clears the list)."""

    total = 0

    def append(self, record: Any) -> None:
        type(self).total += 1
        super().append(record)


def _count_kiln_breaks() -> None:
    import kiln.capture.break_records as break_records

    break_records.BREAKS = _CountingBreaks(break_records.BREAKS)


def _kiln_settings_follow_dynamos() -> None:
    """kiln's capture settings that are Dynamo's config options, read from Dynamo's config: a test
    patches `torch._dynamo.config.capture_scalar_outputs`, kiln's capture sees
    `capture.scalar_outputs` so; likewise `capture.dynamic_ints` (automatic_dynamic_shapes and not
    specialize_int) and `capture.dynamic_sources` (torch.compiler.config.dynamic_sources)."""
    import torch
    import torch._dynamo.config as dynamo_config

    import kiln

    capture = kiln.config.capture

    class FollowingDynamo(type(capture)):
        scalar_outputs = property(lambda self: bool(dynamo_config.capture_scalar_outputs))
        dynamic_ints = property(lambda self: bool(dynamo_config.automatic_dynamic_shapes and not dynamo_config.specialize_int))
        error_on_fx_trace = property(lambda self: bool(dynamo_config.error_on_nested_fx_trace))
        dynamic_sources = property(lambda self: tuple(name.strip() for name in torch.compiler.config.dynamic_sources.split(",")
                                                      if name.strip()))

    object.__setattr__(capture, "__class__", FollowingDynamo)  # (the object every module reads settings through)


def _dynamo_frames() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["frames"].values())


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout("the test ran past the harness's time limit")


def _failure(test_file: Path, exc: BaseException, tb: Any) -> dict[str, Any]:
    """Where a test failed: the exception and the innermost frame in the test files and in
    torch._dynamo.testing (standard_test's assertions), with their source lines. A test file's
    folder counts whole: PyTorch splits large files into mixins (`_test_misc_part1.py`, ...)
    that the file it runs combines."""
    frames = traceback.extract_tb(tb)
    folder = test_file.resolve().parent
    in_test = [f for f in frames if Path(f.filename).resolve().parent == folder]
    in_testing = [f for f in frames if f.filename.endswith("_dynamo/testing.py")]
    in_kiln = [f for f in frames if "/kiln/" in f.filename.replace("\\", "/")]
    # (A frame of generated code may have no line number.)
    line = lambda f: (f.line or (linecache.getline(f.filename, f.lineno) if f.lineno else "")).strip() if f else None  # noqa: E731
    return {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc)[:500],
        "test_line": line(in_test[-1]) if in_test else None,
        "testing_line": line(in_testing[-1]) if in_testing else None,
        "raised_in_kiln": bool(in_kiln) and frames[-1] in in_kiln,
        "innermost": f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else None,
    }


def _test_source(test: Any) -> str:
    """The test method's source ("" where it cannot be read): whether it reads Dynamo's counters
    or messages (a bare `assertTrue(found)` after a search of `counters["unimplemented"]` checks
    Dynamo, not the program), or expects Dynamo's own refusal (`assertRaises(Unsupported)`)."""
    try:
        fn = inspect.unwrap(getattr(test, test._testMethodName))
        # A decorator without functools.wraps (PyTorch's make_logging_test) keeps the test's own
        # function in its closure: that is the source the test's lines come from.
        for cell in getattr(fn, "__closure__", None) or ():
            inner = cell.cell_contents
            if getattr(inner, "__name__", None) == test._testMethodName and inspect.isfunction(inner):
                return inspect.getsource(inner)  # (with its decorators' lines)
        return inspect.getsource(fn)
    except (AttributeError, OSError, TypeError, ValueError):
        return ""


class _Result(unittest.TestResult):
    def __init__(self, test_file: Path) -> None:
        super().__init__()
        self.test_file = test_file
        self.outcome: dict[str, Any] = {}

    def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802 (unittest's name)
        self.outcome = {"outcome": "passed"}

    def _failed(self, test: Any, err: Any) -> dict[str, Any]:
        exc_type, exc, tb = err
        if isinstance(exc, NotRedirected):
            return {"outcome": "not_redirected", "why": str(exc)}
        if isinstance(exc, _Timeout):
            return {"outcome": "timeout"}
        source = _test_source(test)
        return {"outcome": "failed", **_failure(self.test_file, exc, tb),
                "reads_dynamo_counters": "counters" in source or "unimplemented" in source,
                "reads_dynamo_logs": "make_logging_test" in source or "records" in source.split(")", 1)[0],
                "expects_dynamo_refusal": bool(re.search(_DYNAMO_REFUSAL, source)),
                "uses_guard_fail_fn": "guard_fail_fn" in source}

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        self.outcome = self._failed(test, err)

    def addError(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        if not self.outcome or self.outcome.get("outcome") == "passed":
            self.outcome = self._failed(test, err)

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:  # noqa: N802
        self.outcome = {"outcome": "skipped", "why": reason[:200]}

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        self.outcome = {"outcome": "expected_failure"}

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        self.outcome = {"outcome": "unexpected_success"}

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
        if err is not None and self.outcome.get("outcome") != "failed":
            self.outcome = self._failed(test, err)


# A test asserting that Dynamo raises one of its own exceptions (where eager raises Python's, or
# nothing): it checks Dynamo's refusal, not the program's meaning.
_DYNAMO_REFUSAL = r"assertRaises(Regex)?\(\s*(\w+\.)*(Unsupported|InternalTorchDynamoError|UserError)\b"


def _tests(suite: unittest.TestSuite) -> list[unittest.TestCase]:
    out: list[unittest.TestCase] = []
    for item in suite:
        out.extend(_tests(item) if isinstance(item, unittest.TestSuite) else [item])
    return out


def _newer_test_utilities() -> None:
    """Names that newer test files import from torch's test utilities and this torch lacks, given
    stand-ins (both modes run with them): `HardwareClassification`, a tag by which PyTorch's CI
    sorts test classes (test_list.py's `hw_classification = HardwareClassification.GENERIC`);
    `TestCaseWithNestedGraphBreaks` (test_functions.py's base class: newer Dynamo runs its tests
    once more with breaks inside nested calls), here Dynamo's plain `TestCase`."""
    import torch._dynamo.test_case as dynamo_test_case
    from torch.testing._internal import common_utils

    if not hasattr(common_utils, "HardwareClassification"):
        common_utils.HardwareClassification = enum.Enum("HardwareClassification", ["GENERIC"])
    if not hasattr(dynamo_test_case, "TestCaseWithNestedGraphBreaks"):
        dynamo_test_case.TestCaseWithNestedGraphBreaks = dynamo_test_case.TestCase


def run_file(test_file: Path, mode: str, timeout_s: int) -> dict[str, Any]:
    """{"file", "mode", "import_error" or "tests": {test id: outcome}} for one file."""
    _newer_test_utilities()
    sys.meta_path.insert(0, _AliasFinder())
    sys.path.insert(0, str(test_file.parent))
    global _AS_EAGER
    _AS_EAGER = mode == "eager"
    by_object = redirect_to_kiln() if mode in ("kiln", "eager") else {}
    report: dict[str, Any] = {"file": test_file.name, "mode": mode, "python": sys.version.split()[0], "tests": {}}
    name = "dynamo_test_" + test_file.stem
    try:
        spec = importlib.util.spec_from_file_location(name, test_file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except BaseException as e:  # noqa: BLE001 (a file that does not import is reported, not raised)
        report["import_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        return report
    if by_object:
        rebind(module, by_object)
    if mode == "kiln":
        _count_kiln_breaks()
        _kiln_settings_follow_dynamos()
    signal.signal(signal.SIGALRM, _alarm)
    for test in _tests(unittest.TestLoader().loadTestsFromModule(module)):
        result = _Result(test_file)
        frames, breaks = _dynamo_frames(), _CountingBreaks.total
        start = time.perf_counter()
        signal.alarm(timeout_s)
        try:
            test.run(result)
        except _Timeout:
            result.outcome = {"outcome": "timeout"}
        finally:
            signal.alarm(0)
        outcome = result.outcome or {"outcome": "failed", "type": "no outcome", "message": ""}
        outcome["seconds"] = round(time.perf_counter() - start, 3)
        if mode == "kiln":
            outcome["kiln_breaks"] = _CountingBreaks.total - breaks  # (graph breaks and frames run eagerly)
        if mode == "kiln" and _dynamo_frames() > frames and outcome["outcome"] != "not_redirected":
            outcome = {**outcome, "dynamo_ran": True}
        report["tests"][test.id().split(".", 1)[1]] = outcome
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("mode", choices=("dynamo", "kiln", "eager"))
    parser.add_argument("out", type=Path)
    parser.add_argument("--timeout", type=int, default=120, help="seconds a test may run (default 120)")
    args = parser.parse_args(argv)
    report = run_file(args.file, args.mode, args.timeout)
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    code = main()
    # Out without the interpreter's teardown: after test_ctx_manager.py's profiler tests, torch's
    # profiler state crashed kiln mode's process (SIGSEGV) at exit, after the report was
    # written: the file's results were then lost as "worker exited -11".
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
