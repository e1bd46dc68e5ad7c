"""The cache directory's safety rules (kiln/disk_cache.py): kiln loads shared libraries and
unpickles entries from it, so a directory other users can write into is refused, with a warning
naming it and the fix, and the program still runs, compiling into a private temporary directory.
Also: the folders kiln creates are 0o700, and a writer's data and digest are never mixed with
another writer's."""

from __future__ import annotations

import stat
import threading
import time
from pathlib import Path

import pytest
import torch

import kiln
from kiln import disk_cache


def _f(x):
    return (x * 2).sin() + 1


def _compile_and_check() -> None:
    compiled = kiln.compile(_f)
    x = torch.randn(5)
    torch.testing.assert_close(compiled(x), _f(x))


def _files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_cache_directory_others_can_write_is_refused(tmp_path, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with kiln.config.patch({"cache.dir": str(shared)}):
        with pytest.warns(RuntimeWarning, match="writable by other users") as told:
            _compile_and_check()
        private = disk_cache.entry("cpp", "ab" * 32, ".so").parent.parent.parent
    message = str(told[0].message)
    assert str(shared) in message and "chmod go-w" in message and "KILN_CACHE_DIR" in message
    assert oct(mode) in message
    assert _files(shared) == []  # nothing written there, so nothing read from there
    assert private != shared and stat.S_IMODE(private.stat().st_mode) == 0o700
    assert any(p.suffix == ".so" for p in _files(private))  # compiled into the private directory


def test_a_folder_above_the_cache_that_others_can_write_is_refused(tmp_path):
    above = tmp_path / "open"
    above.mkdir()
    above.chmod(0o777)  # another user could rename `cache` away and put their own in its place
    cache = above / "cache"
    with kiln.config.patch({"cache.dir": str(cache)}):
        with pytest.warns(RuntimeWarning, match="above it, is writable by other users"):
            _compile_and_check()
    assert _files(above) == []


def test_a_sticky_folder_above_the_cache_is_accepted(tmp_path):
    above = tmp_path / "tmp-like"
    above.mkdir()
    above.chmod(0o1777)  # as /tmp: others may add files, not rename or replace ours
    cache = above / "cache"
    assert disk_cache.unsafe_reason(above) is not None  # as a cache directory itself: refused
    with kiln.config.patch({"cache.dir": str(cache)}):
        _compile_and_check()
    assert any(p.suffix == ".so" for p in _files(cache))


def test_a_folder_inside_the_cache_that_others_can_write_is_refused(tmp_path):
    cache = tmp_path / "cache"
    (cache / "cpp").mkdir(parents=True)
    (cache / "cpp").chmod(0o777)  # e.g. made by an older kiln under umask 0
    with kiln.config.patch({"cache.dir": str(cache)}):
        with pytest.warns(RuntimeWarning, match="cpp is writable by other users"):
            _compile_and_check()
    assert list((cache / "cpp").iterdir()) == []


def test_a_cache_directory_owned_by_another_user_is_unsafe(tmp_path):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    someone_else = folder.stat().st_uid + 1
    assert "owned by another user" in disk_cache.unsafe_reason(folder, uid=someone_else)
    assert disk_cache.unsafe_reason(folder) is None


def test_folders_kiln_creates_are_private(tmp_path):
    tmp_path.chmod(0o755)
    cache = tmp_path / "a" / "b" / "cache"
    with kiln.config.patch({"cache.dir": str(cache)}):
        _compile_and_check()
    made = [tmp_path / "a", tmp_path / "a" / "b", *[p for p in [cache, *cache.rglob("*")] if p.is_dir()]]
    assert len(made) > 5
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in made} == {"0o700"}
    assert [p for p in _files(cache) if p.stat().st_mode & 0o022] == []  # no file others can write


def test_two_writers_never_leave_one_digest_over_the_others_data(tmp_path, monkeypatch):
    """Writer A stops between its data and writing its digest while writer B writes the same entry
    with other bytes; without the entry's lock B lands in between and A's digest then describes
    data that is no longer there: a miss for every later reader until rewritten."""
    path = tmp_path / "entry.bin"
    real_replace = disk_cache._replace_atomically
    b_done = threading.Event()

    def slow_replace(target, data):
        if threading.current_thread().name == "A" and target.name.endswith(".sha256"):
            b.start()  # A's data is in place and its digest computed, not yet written
            b_done.wait(timeout=0.5)  # with the lock held, B cannot finish: the wait times out
        real_replace(target, data)

    monkeypatch.setattr(disk_cache, "_replace_atomically", slow_replace)
    b = threading.Thread(target=lambda: (disk_cache.write(path, b"B" * 100), b_done.set()), name="B")
    a = threading.Thread(target=disk_cache.write, args=(path, b"A" * 50), name="A")
    a.start()
    a.join()
    b.join()
    assert disk_cache.read(path) == b"B" * 100


def test_a_reader_never_sees_part_of_an_entry(tmp_path):
    """Readers race writers that keep replacing an entry with other bytes: each read is a miss or
    one writer's whole bytes."""
    path = tmp_path / "entry.bin"
    contents = [bytes([n]) * (1000 + 997 * n) for n in range(4)]
    stop = time.monotonic() + 1.0

    def writer(n):
        while time.monotonic() < stop:
            disk_cache.write(path, contents[n])

    writers = [threading.Thread(target=writer, args=(n,)) for n in range(2)]
    for w in writers:
        w.start()
    seen = set()
    while time.monotonic() < stop:
        data = disk_cache.read(path)
        assert data is None or data in contents
        seen.add(data)
    for w in writers:
        w.join()
    assert seen & set(contents)  # the readers did read whole entries
