"""kiln's layering, checked on its import graph: stages never reach forward.

In the order capture -> aot -> passes -> lowering -> schedule -> codegen -> runtime, no module of
a stage imports a later stage, at module level or inside a function; `codegen/` imports no
earlier stage (`passes/`, `lowering/`, `schedule/`): it reads what they made through `ir/`; the modules every stage may
import (`ir/`, `config`, `logs`, shared infrastructure) import no stage at all. Only the doors
and the driver assemble stages: kiln/__init__.py, kiln/api.py, backend/, integrations/, cli.py,
deploy/ (export and the artifact loader), debug/ (bisection, the minifier); `remote_cache` is shared infrastructure like `disk_cache`.
The benchmark (the top-level `benchmarks/` package) is not part of the product: no kiln module
imports it (it adds its commands to `kiln` through entry points). `externs/` (operators' Python
views and fake functions) builds on `native/` (the C++ that defines them and the kernels' unit),
not the other way: `native/` imports nothing of `externs/`. The shared packages import one
another in one direction: their import graph has no loop.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kiln

ROOT = Path(kiln.__file__).parent
STAGES = ["capture", "aot", "passes", "lowering", "schedule", "codegen", "runtime"]
SHARED = ["ir", "config", "logs", "profiler", "trace", "compile_time", "disk_cache", "remote_cache", "heap", "native", "externs", "autotune"]
DOORS = ["backend", "api", "integrations", "cli", "deploy", "debug"]  # they assemble stages; nothing inside imports them


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every kiln module `path` imports (anywhere in the file), with the line."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.append((base, node.lineno))
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return [(name, line) for name, line in found if name.split(".")[0] in ("kiln", "benchmarks")]


def _area(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def import_edges() -> list[tuple[str, str, int]]:
    """(importer, imported, line) over every module of the kiln package."""
    return [(_module_name(path), name, line) for path in sorted(ROOT.rglob("*.py")) for name, line in _imports(path)]


def violations() -> list[str]:
    found = []
    for importer, imported, line in import_edges():
        src, dst = _area(importer), _area(imported)
        where = f"{importer}:{line} imports {imported}"
        if imported.split(".")[0] == "benchmarks":
            found.append(f"{where}: the product never imports the benchmark")
            continue
        if dst is None or src == dst:
            continue
        if src in STAGES and dst in STAGES and STAGES.index(dst) > STAGES.index(src):
            found.append(f"{where}: stage {src} reaches forward to stage {dst}")
        if src == "codegen" and dst in ("passes", "lowering", "schedule"):
            found.append(f"{where}: codegen reads earlier stages only through ir/")
        if src in SHARED and dst in STAGES:
            found.append(f"{where}: {src} is shared by every stage and imports none")
        if src in STAGES + SHARED and dst in DOORS:
            found.append(f"{where}: only the doors and the driver assemble stages")
        if src == "native" and dst == "externs":
            found.append(f"{where}: externs builds on native, not the other way")
    return found


def shared_loops() -> list[str]:
    """Loops in the import graph of the shared packages (`a -> b -> ... -> a`), each once."""
    graph: dict[str, set[str]] = {}
    for importer, imported, _ in import_edges():
        src, dst = _area(importer), _area(imported)
        if src in SHARED and dst in SHARED and src != dst:
            graph.setdefault(src, set()).add(dst)
    loops = set()

    def walk(path: list[str]) -> None:
        for nxt in sorted(graph.get(path[-1], ())):
            if nxt == path[0]:
                loops.add(" -> ".join([*path, nxt]))
            elif nxt not in path and nxt > path[0]:  # each loop found from its smallest package only
                walk([*path, nxt])

    for start in sorted(graph):
        walk([start])
    return sorted(loops)


def test_the_import_graph_is_seen():
    edges = import_edges()
    assert len(edges) > 500  # the walk sees the package, function-level imports included
    assert ("kiln.backend.driver", "kiln.lowering.graph.GraphLowering") in {(a, b) for a, b, _ in edges}


def test_stages_never_reach_forward():
    assert violations() == []


def test_the_shared_packages_import_one_another_in_one_direction():
    assert shared_loops() == []


def test_a_loop_among_shared_packages_is_caught(tmp_path, monkeypatch):
    _plant(tmp_path, monkeypatch, "externs", "from kiln.autotune import gemm\n")
    _plant(tmp_path, monkeypatch, "autotune", "def f():\n    from kiln.externs import native_ops\n")
    assert shared_loops() == ["autotune -> externs -> autotune"]


@pytest.mark.parametrize("source, message", [
    ("def f():\n    from kiln.runtime import fallback\n", "reaches forward"),
    ("from kiln.lowering.registry import LOWERINGS\n", "only through ir/"),
    ("def f():\n    from benchmarks.models import MODELS\n", "never imports the benchmark"),
    ("from kiln.deploy import export\n", "only the doors and the driver"),
])
def test_a_forward_import_is_caught(tmp_path, monkeypatch, source, message):
    # The check itself can fail: a codegen module importing a later or an earlier stage directly.
    _plant(tmp_path, monkeypatch, "codegen", source)
    assert any(message in v for v in violations())


@pytest.mark.parametrize("source", [
    "def f():\n    from kiln.externs import kiln_attention\n",
    "from kiln.externs.native_ops import op\n",
    "import kiln.externs\n",
])
def test_native_importing_anything_of_externs_is_caught(tmp_path, monkeypatch, source):
    _plant(tmp_path, monkeypatch, "native", source)
    assert any("externs builds on native" in v for v in violations())


def _plant(tmp_path, monkeypatch, area, source):
    """A package kiln/ under tmp_path whose only module is kiln/<area>/bad.py, `source`."""
    fake = tmp_path / "kiln" / area
    fake.mkdir(parents=True, exist_ok=True)
    (tmp_path / "kiln" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "bad.py").write_text(source)
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path / "kiln")


BORROWED = ("torch._dynamo", "torch._inductor", "torch._functorch.aot_autograd", "torch._functorch.partitioners")


def borrowed_imports(root: Path = ROOT) -> list[str]:
    """Imports of PyTorch's own compiler outside kiln/integrations/ (the doors torch.compile
    uses): capture, AOT, passes, codegen and caches are kiln's, written here."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "integrations":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) else [])
            hits = [n for n in names if any(n == b or n.startswith(b + ".") for b in BORROWED)]
            found += [f"{path.relative_to(root)}:{node.lineno} imports {hits[0]}"] if hits else []
    return found


def test_pytorchs_own_compiler_is_imported_only_by_the_integrations(tmp_path):
    assert borrowed_imports() == []
    (tmp_path / "passes").mkdir()
    (tmp_path / "passes" / "bad.py").write_text("def f():\n    from torch._inductor import config\n")
    (tmp_path / "integrations").mkdir()
    (tmp_path / "integrations" / "fine.py").write_text("import torch._dynamo\n")
    assert borrowed_imports(tmp_path) == ["passes/bad.py:2 imports torch._inductor"]
