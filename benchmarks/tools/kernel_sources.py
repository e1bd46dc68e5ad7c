"""Every kernel source and wrapper kiln generates for a few small models, written to a folder, to
check that a change to code generation leaves the generated code byte for byte as it was:

    python benchmarks/tools/kernel_sources.py OUT [SETTING ...]      # SETTING: cpp, cpp_wrapper, triton (all)
    python benchmarks/tools/kernel_sources.py --compare BEFORE AFTER

Run it on the old commit and on yours (`PYTHONPATH=<checkout> python benchmarks/tools/kernel_sources.py ...`:
the checkout's kiln and tests are the ones compiled and read), then compare.
The models are the Triton tests' fusion patterns and tiny BERT and ResNet (inference and a training
step, tests/codegen/test_triton_models.py), an MLP (inference, training, dynamic sizes) and a
small convolution net, compiled with `backend.autotune=off` in a fresh cache. Per graph it keeps
the kernels, the Python wrapper, the C++ wrapper where one runs and the artifact's fields, and
every file of the debug dump (KILN_DEBUG_DIR); `--compare` ignores object ids and temporary paths
(the capture's guards name them).
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path

import torch

import kiln
from kiln.backend import watch
from kiln.runtime.compiled_graph import CompiledGraph
from kiln.runtime.frozen import FrozenProgram

SETTINGS = {
    "cpp": {"backend.codegen": "cpp", "backend.autotune": "off"},
    "cpp_wrapper": {"backend.codegen": "cpp", "backend.autotune": "off", "backend.cpp_wrapper": True},
    "triton": {"backend.codegen": "triton", "backend.autotune": "off"},
}


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

    def forward(self, x):
        return torch.softmax(self.b(torch.relu(self.a(x))), -1)


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.bn, self.c2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.c2(torch.relu(self.bn(self.c1(x)))).mean((2, 3))


def cases():
    """(name, function or module, inputs, run a training step, dynamic sizes)."""
    from tests.codegen.test_triton_models import MODELS, PATTERNS

    torch.manual_seed(0)
    for name, (fn, inputs, _) in PATTERNS.items():
        yield name, fn, inputs, False, False
    for name, make in MODELS.items():
        model, inputs, _ = make()
        yield f"{name} eval", model.eval(), inputs, False, False
        model, inputs, _ = make()
        yield f"{name} train", model.train(), inputs, True, False
    yield "mlp", MLP().eval(), (torch.randn(4, 16),), False, False
    yield "mlp train", MLP(), (torch.randn(4, 16),), True, False
    yield "conv", ConvNet().eval(), (torch.randn(2, 3, 8, 8),), False, False
    yield "mlp dynamic", MLP().eval(), (torch.randn(5, 16),), False, True


def write(out: Path, setting: str) -> None:
    cache = tempfile.mkdtemp()
    for name, fn, inputs, train, dynamic in cases():
        dump = Path(tempfile.mkdtemp())
        with kiln.config.patch({**SETTINGS[setting], "debug.dump_dir": str(dump), "cache.dir": cache}), watch() as built:
            compiled = kiln.compile(fn, dynamic=dynamic)
            if train:
                result = compiled(*inputs)
                getattr(result, "last_hidden_state", result).float().sum().backward()
            else:
                with torch.no_grad():
                    compiled(*inputs)
        folder = out / setting / name.replace(" ", "_")
        folder.mkdir(parents=True)
        graphs = [g for b in built if isinstance(g := b.runtime if isinstance(b, FrozenProgram) else b, CompiledGraph)]
        for k, graph in enumerate(graphs):
            artifact = graph.artifact
            (folder / f"{k:02d}_kernels.txt").write_text(graph.source)
            (folder / f"{k:02d}_wrapper.py").write_text(graph.python)
            (folder / f"{k:02d}_artifact.txt").write_text(
                f"codegen={artifact.codegen} device={artifact.device} kernels={artifact.kernels} "
                f"checks={artifact.checks_indices} sizes={artifact.size_arguments}\n{artifact.report}\n")
            if artifact.cpp_wrapper is not None:
                (folder / f"{k:02d}_wrapper.cpp").write_text(artifact.cpp_wrapper)
        for graph_folder in sorted(p for run in dump.iterdir() for p in run.iterdir()):
            for f in sorted(graph_folder.iterdir()):
                (folder / f"dump_{graph_folder.name}_{f.name}").write_bytes(f.read_bytes())
        shutil.rmtree(dump)
        print(setting, name, f"{len(graphs)} graphs", flush=True)


def compare(before: Path, after: Path) -> bool:
    def normal(text: str) -> str:
        return re.sub(r"/tmp/tmp\w+", "TMP", re.sub(r"0x[0-9a-f]+", "0xID", text))

    files_before = {p.relative_to(before) for p in before.rglob("*") if p.is_file()}
    files_after = {p.relative_to(after) for p in after.rglob("*") if p.is_file()}
    differ = sorted(str(p) for p in files_before & files_after
                    if normal((before / p).read_text()) != normal((after / p).read_text()))
    for p in sorted(files_before ^ files_after):
        print("only in", "before:" if p in files_before else "after:", p)
    for p in differ:
        print("differs:", p)
    print(f"{len(files_before & files_after)} files in both, {len(differ)} differ")
    return not differ and files_before == files_after


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        sys.exit(0 if compare(Path(sys.argv[2]), Path(sys.argv[3])) else 1)
    target = Path(sys.argv[1])
    shutil.rmtree(target, ignore_errors=True)
    for setting in sys.argv[2:] or SETTINGS:
        write(target, setting)
