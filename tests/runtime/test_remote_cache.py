"""The Redis tier under the disk cache (kiln/remote_cache.py), against a real `redis-server` the
tests start on a free loopback port (the Debian package; the project's set-up installs it)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kiln import disk_cache, remote_cache

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    server = shutil.which("redis-server")
    assert server, "redis-server is missing: `make setup` installs it (apt-get install redis-server)"
    port = _free_port()
    folder = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b"*1\r\n$4\r\nPING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "redis-server did not start"
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


_PROGRAM = textwrap.dedent("""
    import json, sys, torch, kiln
    from kiln.native import build
    from kiln.autotune.choose import COUNTS
    from kiln import remote_cache
    builds = []
    real_build = build._build
    build._build = lambda *a: builds.append(1) or real_build(*a)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64)).eval()
    x = torch.randn(8, 64)
    with torch.no_grad():
        out = kiln.compile(model)(x)
        torch.testing.assert_close(out, model(x))
    print(json.dumps({"builds": len(builds), "autotuned": COUNTS["measured"], **remote_cache.STATS}))
""")


def _run(cache_dir: Path, url: str, secret: str | None = None) -> dict:
    env = {**os.environ, "KILN_CACHE_DIR": str(cache_dir), "KILN_REMOTE_CACHE": url, "PYTHONPATH": str(REPO)}
    env.pop("KILN_REMOTE_CACHE_SECRET", None)
    if secret is not None:
        env["KILN_REMOTE_CACHE_SECRET"] = secret
    done = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


def test_a_second_process_with_an_empty_disk_cache_compiles_nothing(tmp_path, redis_url):
    url = redis_url + "/1"
    first = _run(tmp_path / "first", url)
    assert first["builds"] >= 1 and first["autotuned"] >= 1 and first["stored"] >= 3  # library, AOT graph, GEMM choice
    second = _run(tmp_path / "second", url)  # its own, empty, disk cache
    assert second["builds"] == 0 and second["autotuned"] == 0 and second["hits"] >= 2 and second["rejected"] == 0
    assert any((tmp_path / "second" / "cpp").rglob("*.so"))  # written to the local tier as it was read


def test_a_corrupt_or_unsigned_entry_is_rebuilt_and_reported(tmp_path, redis_url, monkeypatch):
    url = redis_url + "/2"
    monkeypatch.setattr(disk_cache.config.cache, "dir", str(tmp_path / "local"))
    monkeypatch.setattr(disk_cache.config.cache, "remote", url)
    monkeypatch.delenv("KILN_REMOTE_CACHE_SECRET", raising=False)
    remote_cache._TIERS.clear()
    tier = remote_cache.tier()
    path = disk_cache.entry("aot", "ab" + "0" * 62, ".pkl")
    disk_cache.write(path, b"the entry")
    path.unlink()  # a local miss: the remote tier answers
    assert disk_cache.read(path) == b"the entry"
    # Overwrite the blob the index names: the digest no longer matches, so it is refused.
    meta = json.loads(tier.client.command(b"GET", tier._index_key("aot/" + path.name)))
    tier.client.command(b"SET", tier._blob_key(meta["sha256"]), b"other bytes")
    path.unlink()
    with pytest.warns(RuntimeWarning, match="was refused: its bytes do not match the digest"):
        assert disk_cache.read(path) is None  # a miss: the caller rebuilds
    # With a secret, an entry written without it is refused too.
    disk_cache.write(path, b"unsigned")
    path.unlink()
    monkeypatch.setenv("KILN_REMOTE_CACHE_SECRET", "team secret")
    remote_cache._TIERS.clear()
    with pytest.warns(RuntimeWarning, match="not signed with KILN_REMOTE_CACHE_SECRET"):
        assert disk_cache.read(path) is None
    disk_cache.write(path, b"signed")  # written by a holder of the secret: read back
    path.unlink()
    assert disk_cache.read(path) == b"signed"
    remote_cache._TIERS.clear()


def test_an_unreachable_server_warns_once_and_compiles_locally(tmp_path, monkeypatch):
    monkeypatch.setattr(disk_cache.config.cache, "dir", str(tmp_path / "local"))
    monkeypatch.setattr(disk_cache.config.cache, "remote", f"redis://127.0.0.1:{_free_port()}")
    remote_cache._TIERS.clear()
    path = disk_cache.entry("aot", "cd" + "0" * 62, ".pkl")
    with pytest.warns(RuntimeWarning, match="is unreachable or failed"):
        assert disk_cache.read(path) is None
    disk_cache.write(path, b"local only")  # no second warning: the tier is off for the process
    assert disk_cache.read(path) == b"local only"
    remote_cache._TIERS.clear()


def test_a_bad_url_names_the_setting():
    with pytest.raises(ValueError, match=r"cache.remote \(KILN_REMOTE_CACHE\) must be redis://host:port\[/db\]"):
        remote_cache.RemoteTier("http://example.com")
