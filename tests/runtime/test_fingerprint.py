"""kiln's source fingerprint (kiln/disk_cache.py `kiln_fingerprint`), in the key of every compiled
graph: every file kiln builds from is in it -- Python, the runtime's C++ sources, headers and
linker map -- so a change to any of them invalidates what was cached; bytecode is not."""

import shutil
import subprocess
from pathlib import Path

import pytest

import kiln
from kiln import disk_cache

PACKAGE = Path(kiln.__file__).resolve().parent


@pytest.fixture
def copy(tmp_path):
    """A copy of the kiln package's files to change."""
    target = tmp_path / "kiln"
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def test_the_copy_hashes_as_the_package(copy):
    assert disk_cache.fingerprint(copy) == disk_cache.kiln_fingerprint()


@pytest.mark.parametrize("name", ["native/src/kiln_runtime.cpp", "native/src/kiln_runtime.map",
                                  "native/include/kiln_vec.h", "aot/cache.py"])
def test_a_change_to_a_source_changes_the_fingerprint(copy, name):
    before = disk_cache.fingerprint(copy)
    source = copy / name
    source.write_bytes(source.read_bytes() + b"\n")
    assert disk_cache.fingerprint(copy) != before


def test_a_new_kind_of_source_file_is_counted(copy):
    before = disk_cache.fingerprint(copy)
    (copy / "native" / "src" / "kiln_more.inc").write_text("int x;\n")
    assert disk_cache.fingerprint(copy) != before


def test_bytecode_and_hidden_files_are_not(copy):
    before = disk_cache.fingerprint(copy)
    (copy / "aot" / "__pycache__").mkdir()
    (copy / "aot" / "__pycache__" / "cache.cpython-312.pyc").write_bytes(b"\0")
    (copy / "aot" / ".cache.py.swp").write_bytes(b"\0")
    assert disk_cache.fingerprint(copy) == before


def test_every_file_git_tracks_in_the_package_is_in_it():
    root = PACKAGE.parent
    if not (root / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "-C", str(root), "ls-files", "kiln"], capture_output=True, text=True, check=True)
    hashed = {str(path.relative_to(root)) for path in disk_cache.source_files(PACKAGE)}
    missing = [name for name in tracked.stdout.split() if name not in hashed and (root / name).exists()]
    assert not missing
