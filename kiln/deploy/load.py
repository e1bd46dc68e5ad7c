"""`kiln.load`: an exported artifact (kiln/deploy/export.py) as a Python callable.

    run = kiln.load("out/bert")
    last_hidden_state, pooler_output = run(input_ids=ids, attention_mask=mask)

The artifact is checked before anything of it runs: its format, the kiln and torch versions and
the CPU ISA it was built for against this process's (an error names both), the digests of its
library and weights (a corrupted file is named, never loaded). A call is checked against the
inputs the artifact was exported with (names, dtypes, shapes); the outputs come back as a tuple in
the order of the model's result, flattened.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

import torch

import kiln
from kiln.deploy import isa, safetensors
from kiln.deploy.export import FORMAT, digest
from kiln.native import python_door
from kiln.native.build import machine


class ArtifactError(RuntimeError):
    """An artifact that cannot run here: another version or ISA, a missing or corrupted file."""


class LoadedArtifact:
    """`(*inputs, **named_inputs) -> tuple of outputs` of an exported model."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.metadata = _metadata(self.path)
        _check_compatible(self.path, self.metadata)
        for name, recorded in self.metadata["digests"].items():
            if _readable_digest(self.path / name) != recorded:
                raise ArtifactError(f"kiln.load: {self.path / name} does not match its digest in metadata.json "
                                    "(the file is corrupted or was replaced): export the model again")
        stored = safetensors.load(self.path / "weights.safetensors")
        self.weights = {name: _laid_out(stored[name], layout) for name, layout in self.metadata["weights"].items()}
        self.inputs = self.metadata["inputs"]
        library = ctypes.CDLL(str(self.path / "model.so"))
        self._run = python_door.graph_call(getattr(library, self.metadata["entry"]), library.kiln_error,
                                           self.metadata["graph_outputs"], build=False, runtime=library)

    def signature(self) -> str:
        """`ids: int64[batch, 16], mask: int64[batch, 16] (batch in [2, 64])`."""
        text = ", ".join(f"{i['name']}: {i['dtype']}[{', '.join(str(d) for d in i['shape'])}]" for i in self.inputs)
        symbols = self.metadata.get("symbols", {})
        ranges = ", ".join(f"{name} in [{r['min']}, {'inf' if r['max'] is None else r['max']}]"
                           for name, r in symbols.items())
        return f"{text} ({ranges})" if ranges else text

    def __call__(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        given = self._bind(args, kwargs)
        graph_inputs = [given[step["input"]] if "input" in step else self.weights[step["weight"]]
                        for step in self.metadata["graph_inputs"]]
        graph_outputs = self._run(*graph_inputs)
        return tuple(graph_outputs[o["graph_output"]] for o in self.metadata["outputs"])

    def _bind(self, args: tuple, kwargs: dict) -> list[torch.Tensor]:
        names = [i["name"] for i in self.inputs]
        if len(args) > len(names):
            raise TypeError(f"kiln.load: the artifact takes {len(names)} inputs ({self.signature()}), got {len(args)}")
        bound = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names or name in bound:
                raise TypeError(f"kiln.load: unexpected or repeated input {name!r}; the artifact takes {self.signature()}")
            bound[name] = value
        missing = [n for n in names if n not in bound]
        if missing:
            raise TypeError(f"kiln.load: missing input {missing[0]!r}; the artifact takes {self.signature()}")
        sizes: dict[str, int] = {}  # each symbol's size in this call
        for spec in self.inputs:
            value = bound[spec["name"]]
            if not isinstance(value, torch.Tensor) or str(value.dtype).removeprefix("torch.") != spec["dtype"] \
                    or not self._fits(list(value.shape), spec["shape"], sizes):
                got = f"{value.dtype}{list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
                want = f"{spec['dtype']}[{', '.join(str(d) for d in spec['shape'])}]"
                raise ValueError(f"kiln.load: input {spec['name']!r} must be {want}, got {got}; "
                                 f"the artifact takes {self.signature()}")
        return [bound[n] for n in names]

    def _fits(self, shape: list[int], spec: list[int | str], sizes: dict[str, int]) -> bool:
        """Whether `shape` is `spec`: its numbers exactly, each symbol within its range and the same
        size wherever it appears (`sizes` keeps those seen so far in the call)."""
        if len(shape) != len(spec):
            return False
        for size, want in zip(shape, spec):
            if isinstance(want, int):
                if size != want:
                    return False
                continue
            bounds = self.metadata["symbols"][want]
            if sizes.setdefault(want, size) != size or size < bounds["min"] \
                    or bounds["max"] is not None and size > bounds["max"]:
                return False
        return True


def load(path: str | Path) -> LoadedArtifact:
    """The artifact `kiln.export` wrote to `path`, ready to call."""
    return LoadedArtifact(path)


def _metadata(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / "metadata.json").read_text())
    except (OSError, ValueError) as error:
        raise ArtifactError(f"kiln.load: {path} is not a kiln artifact ({error})") from None


def _check_compatible(path: Path, metadata: dict[str, Any]) -> None:
    here = {"format": FORMAT, "kiln_version": kiln.__version__, "torch_version": torch.__version__}
    what = {"format": "artifact format", "kiln_version": "kiln version", "torch_version": "torch version"}
    for key, value in here.items():
        if metadata.get(key) != value:
            raise ArtifactError(f"kiln.load: {path} was built for {what[key]} {metadata.get(key)!r}; "
                                f"this process has {value!r}: export the model again here")
    if "isa_flags" in metadata:  # the extensions of the CPU it was built on, all needed here
        lacking = isa.missing(metadata["isa_flags"], metadata.get("arch"))
        if lacking:
            raise ArtifactError(f"kiln.load: {path} was built for the CPU instruction set of {metadata.get('cpu')} "
                                f"(-march=native there); this CPU ({isa.cpu_name()}) lacks {', '.join(lacking)}: "
                                "export the model again here")
    elif metadata.get("isa") != machine():  # (an artifact of an earlier kiln: the digest, which needs g++)
        raise ArtifactError(f"kiln.load: {path} was built for CPU instruction set (-march=native) "
                            f"{metadata.get('isa')!r} on {metadata.get('cpu')}; this process has {machine()!r}: "
                            "export the model again here")


def _laid_out(t: torch.Tensor, layout: dict[str, Any]) -> torch.Tensor:
    """A weight in the layout it had when exported (the file stores it contiguous): the tensor
    over the mapped file itself where that is its layout and its bytes are aligned for its type
    (safetensors packs tensors without gaps, so after an odd-length one they may not be), else a
    copy in that layout."""
    if list(t.stride()) == layout["stride"] or t.numel() <= 1:
        return t if t.data_ptr() % t.element_size() == 0 else t.clone()
    return torch.empty_strided(t.shape, layout["stride"], dtype=t.dtype).copy_(t)


def _readable_digest(path: Path) -> str:
    try:
        return digest(path)
    except OSError as error:
        raise ArtifactError(f"kiln.load: {path} cannot be read ({error})") from None
