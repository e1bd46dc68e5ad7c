"""Objects of units many libraries share (kiln's runtime, linked into every exported model) are
cached on their own (kiln/native/build.py `reused_units`): a second library that shares them
compiles only its other units, and a damaged object is compiled again, never linked."""

from __future__ import annotations

import ctypes
from pathlib import Path

import kiln
from kiln.native import build

SHARED = 'extern "C" int kiln_test_shared() { return 40; }\n'


def _own(value: int) -> str:
    return f'extern "C" int kiln_test_own() {{ return {value}; }}\n'


def _compiled_sources(monkeypatch) -> list[str]:
    """The sources each later compiler command of this test compiles (linking excluded)."""
    compiled, run_all = [], build._run_all

    def recording(commands):
        for command in commands:
            if "-c" in command:
                compiled.append(Path(command[command.index("-c") + 1]).read_text())
        run_all(commands)

    monkeypatch.setattr(build, "_run_all", recording)
    return compiled


def _call(path: Path) -> int:
    library = ctypes.CDLL(str(path))
    return library.kiln_test_own() + library.kiln_test_shared()


def test_a_second_library_sharing_a_reused_unit_compiles_only_its_own(tmp_path, monkeypatch):
    compiled = _compiled_sources(monkeypatch)
    with kiln.config.patch({"cache.dir": str(tmp_path / "cache"), "cache.runtime_dir": str(tmp_path / "runtime")}):
        first, built = build.build_library([_own(1), SHARED], reused_units=[1])
        assert built and compiled == [_own(1), SHARED]
        second, built = build.build_library([_own(2), SHARED], reused_units=[1])
        assert built and second != first
        assert compiled == [_own(1), SHARED, _own(2)]  # the shared unit's object came from the cache
        assert (_call(first), _call(second)) == (41, 42)
        objects = list((tmp_path / "runtime" / "cpp-objects").rglob("*.o"))
        assert len(objects) == 1
        # Not reused: compiled each time (a graph's kernels are cached as whole libraries only).
        build.build_library([_own(3), SHARED])
        assert compiled[-2:] == [_own(3), SHARED]


def test_a_damaged_cached_object_is_compiled_again_not_linked(tmp_path, monkeypatch):
    compiled = _compiled_sources(monkeypatch)
    with kiln.config.patch({"cache.dir": str(tmp_path / "cache"), "cache.runtime_dir": str(tmp_path / "runtime")}):
        build.build_library([_own(1), SHARED], reused_units=[1])
        (kept,) = (tmp_path / "runtime" / "cpp-objects").rglob("*.o")
        kept.write_bytes(b"not an object")
        path, built = build.build_library([_own(5), SHARED], reused_units=[1])
        assert built and compiled[-2:] == [_own(5), SHARED]
        assert _call(path) == 45
        assert kept.read_bytes() != b"not an object"  # the object was replaced by the good one
