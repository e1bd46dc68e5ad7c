"""`kiln prebuild` (kiln/native/prebuild.py): kiln's own libraries are built at install time into
`cache.prebuilt_dir`, and a process finds them there before its caches, so no first compile builds
them; an entry there is loaded only when intact and in a folder no other user can write."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kiln
from kiln import cli
from kiln.native import build, prebuild

# A library small enough to build in a second: the mechanism is the same for kiln's runtime.
SOURCE = 'extern "C" int kiln_test_prebuilt() { return 7; }\n'


def _libraries(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.so")) if folder.exists() else []


def test_a_prebuilt_library_is_used_before_the_cache(tmp_path):
    with kiln.config.patch({"cache.prebuilt_dir": str(tmp_path / "prebuilt"),
                            "cache.runtime_dir": str(tmp_path / "runtime")}):
        path, built = build.prebuild_library([SOURCE])
        assert built and path.parent.parent == tmp_path / "prebuilt"
        assert build.prebuild_library([SOURCE]) == (path, False)  # a second prebuild builds nothing
        found, built = build.build_library(SOURCE, own=True)
        assert (found, built) == (path, False)
        assert build.cached_library(SOURCE, own=True) == path
        assert _libraries(tmp_path / "runtime") == []
        # Not kiln's own: the user's cache, never the prebuilt folder.
        assert build.build_library(SOURCE)[0] != path


def test_a_prebuilt_library_others_can_write_or_that_was_altered_is_not_loaded(tmp_path):
    with kiln.config.patch({"cache.prebuilt_dir": str(tmp_path / "prebuilt"),
                            "cache.runtime_dir": str(tmp_path / "runtime")}):
        path, _ = build.prebuild_library([SOURCE])
        path.parent.chmod(0o777)
        found, built = build.build_library(SOURCE, own=True)
        assert built and found != path and found.is_relative_to(tmp_path / "runtime")
        path.parent.chmod(0o755)
        path.write_bytes(path.read_bytes() + b"\0")  # no longer what its digest says
        assert build.cached_library(SOURCE, own=True) == found  # the cache's copy, not the altered one


def test_kiln_prebuild_builds_each_library_and_says_where(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(prebuild, "LIBRARIES", {"one": lambda: ([SOURCE], [], []),
                                                "two": lambda: ([SOURCE + "// two\n"], [], [])})
    with kiln.config.patch({"cache.prebuilt_dir": ""}):
        assert cli.main(["prebuild", "--dir", str(tmp_path)]) == 0
        first = capsys.readouterr().out
        assert cli.main(["prebuild", "--dir", str(tmp_path)]) == 0
        again = capsys.readouterr().out
    assert first.count("built in") == 2 and again.count("already built") == 2
    assert len(_libraries(tmp_path)) == 2 and str(tmp_path) in first


def test_after_the_readme_set_up_a_first_compile_builds_none_of_kilns_own_libraries(tmp_path):
    # `make setup` ran `kiln prebuild` into this environment: a process with empty caches compiles a
    # C++-wrapper graph (which needs the runtime and the extension) and builds only its own kernels.
    script = textwrap.dedent("""
        import torch, kiln
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()).eval()
        with torch.no_grad():
            x = torch.randn(2, 16)
            torch.testing.assert_close(kiln.compile(model)(x), model(x))
    """)
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache"), "KILN_RUNTIME_CACHE_DIR": str(tmp_path / "runtime"),
           "KILN_LOGS": "cache"}
    env.pop("KILN_PREBUILT_DIR", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _libraries(tmp_path / "runtime") == [], (
        "kiln's own libraries were built inside a first compile: run `kiln prebuild` (the README's "
        f"`make setup` does)\n{done.stderr[-2000:]}")
    assert done.stderr.count("prebuilt at install time") >= 2
