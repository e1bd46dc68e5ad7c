"""The Redis tier under the disk cache (kiln/remote_cache.py), against a real `redis-server` the
tests start on a free loopback port (the Debian package; the project's set-up installs it)."""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.parse
import warnings
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kiln import disk_cache, remote_cache

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(folder: Path, *args: str, port: int | None = None, ping_url: str | None = None):
    """A redis-server on a free loopback port (or `port`) with `args`, ready: the process and its port.
    Ready means `ping_url` (default redis://127.0.0.1:<port>) answers a PING, or, on a plain port
    of a server that wants a password, NOAUTH."""
    server = shutil.which("redis-server")
    assert server, "redis-server is missing: `make setup` installs it (apt-get install redis-server)"
    port = port or _free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(folder), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis.from_url(ping_url or f"redis://127.0.0.1:{port}", socket_timeout=2, socket_connect_timeout=2,
                                  retry=Retry(NoBackoff(), 0))
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.AuthenticationError:
            break
        except redis.RedisError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.terminate()
            raise AssertionError(f"redis-server {' '.join(args)} did not start")
        time.sleep(0.05)
    client.close()
    return proc, port


@contextlib.contextmanager
def _server(folder: Path, *args: str, **kwargs):
    proc, port = _start_server(folder, *args, **kwargs)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    with _server(tmp_path_factory.mktemp("redis")) as port:
        yield f"redis://127.0.0.1:{port}"


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


def test_a_machine_reads_only_graphs_written_under_its_own_cpu(tmp_path, redis_url, monkeypatch):
    # A compiled graph carries its machine's autotuning answers: the tier shares it between
    # machines of one CPU (its key names the CPU, kiln/aot/cache.py), never across CPUs.
    import torch
    from torch import fx

    from kiln import aot
    from kiln.aot import cache as aot_cache
    from kiln.backend import Backend

    monkeypatch.setattr(disk_cache.config.cache, "remote", redis_url + "/3")
    remote_cache._TIERS.clear()
    loaded = []
    real_load = aot_cache.load
    monkeypatch.setattr(aot_cache, "load", lambda key: loaded.append(real_load(key) is not None) or real_load(key))
    module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    x = torch.randn(4, 8)

    def compile_on(cpu: str, local: str) -> None:
        """A process of a machine with CPU `cpu` and an empty disk cache compiles the module."""
        monkeypatch.setattr(disk_cache, "cpu_identity", lambda: cpu)
        monkeypatch.setattr(disk_cache.config.cache, "dir", str(tmp_path / local))
        with torch.no_grad():
            compiled = aot.compile(fx.symbolic_trace(module), [x], Backend(), options=aot.AotOptions(cache=True))
            torch.testing.assert_close(compiled(x), module(x))

    try:
        compile_on("CPU A|fma avx2 avx512f|AVX512", "a")
        compile_on("CPU B|fma avx2|AVX2", "b")  # A's graph is on the server: not for B
        compile_on("CPU A|fma avx2 avx512f|AVX512", "another a")  # another machine of A's kind: from the server
    finally:
        remote_cache._TIERS.clear()
    assert loaded == [False, False, True]


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
    meta = json.loads(tier.client.get(tier._index_key("aot/" + path.name)))
    tier.client.set(tier._blob_key(meta["sha256"]), b"other bytes")
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


@pytest.mark.parametrize("url, problem", [
    ("http://example.com", "the scheme must be redis or rediss"),
    ("example.com:6379", "the scheme must be redis or rediss"),
    ("redis://", "it names no host"),
    ("redis://:hunter2@/0", "it names no host"),
    ("redis://host/cache", "the database 'cache' is not a number"),
    ("redis://host:port", "Port could not be cast"),
])
def test_a_bad_url_names_the_setting_and_the_accepted_forms(url, problem):
    with pytest.raises(ValueError) as error:
        remote_cache.RemoteTier(url)
    message = str(error.value)
    assert message.startswith("cache.remote (KILN_REMOTE_CACHE) must be "
                              "redis://[[user]:password@]host[:port][/db], or rediss://... for TLS; got ")
    assert problem in message
    assert "hunter2" not in message  # a password is never shown


def test_a_timeout_must_be_above_zero(monkeypatch):
    monkeypatch.setattr(remote_cache.config.cache, "remote_timeout_s", 0.0)
    with pytest.raises(ValueError, match=r"cache.remote_timeout_s \(KILN_REMOTE_CACHE_TIMEOUT\) must be a number of "
                                         r"seconds above 0; got 0.0"):
        remote_cache.RemoteTier("redis://127.0.0.1")


# --- AUTH, ACL users, TLS, timeouts, without redis-py ------------------------------------------

def _use(monkeypatch, tmp_path: Path, url: str) -> None:
    """Point kiln's disk cache at a folder under tmp_path and its remote tier at `url`."""
    monkeypatch.setattr(disk_cache.config.cache, "dir", str(tmp_path / "local"))
    monkeypatch.setattr(disk_cache.config.cache, "remote", url)
    monkeypatch.delenv("KILN_REMOTE_CACHE_SECRET", raising=False)
    remote_cache._TIERS.clear()


def _round_trip(key: str, data: bytes) -> bytes | None:
    """Write an entry (offered to the remote tier), forget it locally, read it back (from the
    remote tier when it works; None when it does not)."""
    path = disk_cache.entry("aot", key + "0" * 62, ".pkl")
    disk_cache.write(path, data)
    path.unlink()
    return disk_cache.read(path)


def _assert_local_cache_works(key: str) -> None:
    path = disk_cache.entry("aot", key + "0" * 62, ".pkl")
    disk_cache.write(path, b"kept locally")
    assert disk_cache.read(path) == b"kept locally"


PASSWORD = "p@ss:w/rd %"  # quoted in a URL: p%40ss%3Aw%2Frd%20%25


@pytest.fixture(scope="module")
def auth_port(tmp_path_factory):
    """A server that wants a password (requirepass, the `default` user), with two ACL users:
    `writer` may do anything, `reader` may not write."""
    with _server(tmp_path_factory.mktemp("redis-auth"), "--requirepass", PASSWORD,
                 "--user", "writer", "on", ">writer-pw", "~*", "&*", "+@all",
                 "--user", "reader", "on", ">reader-pw", "~*", "&*", "+@all", "-@write") as port:
        yield port


def test_a_password_in_the_url_authenticates(tmp_path, monkeypatch, auth_port):
    quoted = urllib.parse.quote(PASSWORD, safe="")
    _use(monkeypatch, tmp_path, f"redis://:{quoted}@127.0.0.1:{auth_port}/3")
    hits = remote_cache.STATS["hits"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: the tier works
        assert _round_trip("a1", b"behind a password") == b"behind a password"
    assert remote_cache.STATS["hits"] == hits + 1 and not remote_cache.tier().broken
    # It is on the server, in database 3, for a client that gives the password.
    server = redis.Redis(port=auth_port, password=PASSWORD, db=3)
    assert b"behind a password" in [server.get(key) for key in server.keys("kiln:*:blob:*")]


def test_a_user_and_password_in_the_url_authenticate_as_that_user(tmp_path, monkeypatch, auth_port):
    _use(monkeypatch, tmp_path, f"redis://writer:writer-pw@127.0.0.1:{auth_port}/4")
    assert _round_trip("a2", b"as writer") == b"as writer"
    assert not remote_cache.tier().broken


@pytest.mark.parametrize("url, told", [
    ("redis://127.0.0.1:{port}/5", "authenticat"),  # no password (the old client never sent one)
    ("redis://:wrong-password@127.0.0.1:{port}/5", "invalid username-password pair"),
    ("redis://writer:wrong-password@127.0.0.1:{port}/5", "invalid username-password pair"),
])
def test_refused_credentials_switch_the_tier_off_once_and_the_local_cache_works(tmp_path, monkeypatch, auth_port, url, told):
    _use(monkeypatch, tmp_path, url.format(port=auth_port))
    with pytest.warns(RuntimeWarning, match="refused kiln's credentials") as record:
        assert _round_trip("a3", b"entry") is None  # not on the server: a miss
    (warning,) = [w for w in record if "remote cache" in str(w.message)]
    assert "wrong-password" not in str(warning.message)  # the password is never shown
    tier = remote_cache.tier()
    assert tier.broken and told in tier.off_reason.lower() and tier.off_reason == str(warning.message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: the tier is off for the process
        _assert_local_cache_works("a4")


def test_a_user_the_server_lets_only_read_reads_and_stops_writing(tmp_path, monkeypatch, auth_port):
    writer = f"redis://writer:writer-pw@127.0.0.1:{auth_port}/6"
    reader = f"redis://reader:reader-pw@127.0.0.1:{auth_port}/6"
    _use(monkeypatch, tmp_path / "w", writer)
    written = disk_cache.entry("aot", "b1" + "0" * 62, ".pkl")
    disk_cache.write(written, b"from the writer")
    _use(monkeypatch, tmp_path / "r", reader)
    assert disk_cache.read(disk_cache.entry("aot", "b1" + "0" * 62, ".pkl")) == b"from the writer"
    with pytest.warns(RuntimeWarning, match="does not let kiln's user write .*no permissions.*only reads from it"):
        disk_cache.write(disk_cache.entry("aot", "b2" + "0" * 62, ".pkl"), b"refused")
    tier = remote_cache.tier()
    assert tier.read_only and not tier.broken
    # Reads go on: an entry the writer adds afterwards is read by the reader.
    later = disk_cache.entry("aot", "b3" + "0" * 62, ".pkl")
    remote_cache.RemoteTier(writer).put(disk_cache._remote_name(later), b"later")
    monkeypatch.setattr(tier.client, "set", lambda *args, **kwargs: pytest.fail("written after a refused write"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the refused write was said once
        assert disk_cache.read(later) == b"later"
        disk_cache.write(disk_cache.entry("aot", "b4" + "0" * 62, ".pkl"), b"not offered")


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    """A server with a plain port and a TLS port whose certificate (for 127.0.0.1) a test CA
    signed: (plain port, TLS port, the CA's certificate)."""
    openssl = shutil.which("openssl")
    assert openssl, "openssl is missing: `make setup` installs it (apt-get install openssl)"
    folder = tmp_path_factory.mktemp("redis-tls")

    def run(*args):
        subprocess.run([openssl, *args], cwd=folder, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=kiln test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (folder / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.crt", "-days", "2", "-extfile", "ext")
    tls_port = _free_port()
    with _server(folder, "--tls-port", str(tls_port), "--tls-cert-file", str(folder / "server.crt"),
                 "--tls-key-file", str(folder / "server.key"), "--tls-ca-cert-file", str(folder / "ca.crt"),
                 "--tls-auth-clients", "no") as port:
        yield port, tls_port, folder / "ca.crt"


def test_rediss_talks_tls_and_checks_the_certificate(tmp_path, monkeypatch, tls):
    plain_port, tls_port, ca = tls
    url = f"rediss://127.0.0.1:{tls_port}/1?ssl_ca_certs={urllib.parse.quote(str(ca))}"
    _use(monkeypatch, tmp_path / "ok", url)
    assert isinstance(remote_cache.tier().client.connection_pool.make_connection(), redis.SSLConnection)
    assert _round_trip("c1", b"over TLS") == b"over TLS"
    assert not remote_cache.tier().broken
    assert redis.Redis(port=plain_port, db=1).keys("kiln:*:index:aot/c1*")  # the same server
    # A certificate no CA the client trusts signed: refused (the system's CAs do not know the test CA).
    _use(monkeypatch, tmp_path / "unknown-ca", f"rediss://127.0.0.1:{tls_port}/1")
    with pytest.warns(RuntimeWarning, match="is unreachable or failed .*certificate verify failed"):
        assert _round_trip("c2", b"entry") is None
    _assert_local_cache_works("c3")
    # A certificate for another host (it names 127.0.0.1, not localhost): refused.
    _use(monkeypatch, tmp_path / "other-host", f"rediss://localhost:{tls_port}/1?ssl_ca_certs={urllib.parse.quote(str(ca))}")
    with pytest.warns(RuntimeWarning, match="is unreachable or failed .*(match|mismatch)"):
        assert _round_trip("c6", b"entry") is None
    # Plain text to the TLS port: refused too.
    _use(monkeypatch, tmp_path / "plain", f"redis://127.0.0.1:{tls_port}/1")
    with pytest.warns(RuntimeWarning, match="is unreachable or failed"):
        assert _round_trip("c4", b"entry") is None
    _assert_local_cache_works("c5")


def test_rediss_without_a_server_makes_tls_connections():
    tier = remote_cache.RemoteTier("rediss://cache.example:6380/2")
    kwargs = tier.client.connection_pool.connection_kwargs
    assert tier.client.connection_pool.connection_class is redis.SSLConnection
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("cache.example", 6380, 2)
    plain = remote_cache.RemoteTier("redis://cache.example")
    assert plain.client.connection_pool.connection_class is redis.Connection


def test_the_timeout_settings_reach_the_connection(monkeypatch):
    monkeypatch.setattr(remote_cache.config.cache, "remote_connect_timeout_s", 1.5)
    monkeypatch.setattr(remote_cache.config.cache, "remote_timeout_s", 2.5)
    kwargs = remote_cache.RemoteTier("redis://cache.example").client.connection_pool.connection_kwargs
    assert (kwargs["socket_connect_timeout"], kwargs["socket_timeout"]) == (1.5, 2.5)


def test_a_server_that_never_answers_times_out_and_switches_the_tier_off(tmp_path, monkeypatch):
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        _use(monkeypatch, tmp_path, f"redis://127.0.0.1:{silent.getsockname()[1]}")
        monkeypatch.setattr(remote_cache.config.cache, "remote_timeout_s", 0.3)
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match="is unreachable or failed .*Timeout"):
            assert _round_trip("d1", b"entry") is None
        assert time.monotonic() - start < 3  # two tries of 0.3 s, not the 5 s default
    assert remote_cache.tier().broken
    _assert_local_cache_works("d2")


def test_without_redis_py_one_warning_names_the_extra_and_the_cache_is_local(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)  # `import redis` raises ImportError
    _use(monkeypatch, tmp_path, "redis://:hunter2@127.0.0.1:6379")
    path = disk_cache.entry("aot", "e1" + "0" * 62, ".pkl")
    with pytest.warns(RuntimeWarning) as record:
        assert disk_cache.read(path) is None
    (warning,) = [w for w in record if "KILN_REMOTE_CACHE" in str(w.message)]
    assert "pip install 'kiln[remote]'" in str(warning.message) and "hunter2" not in str(warning.message)
    assert remote_cache.tier().broken and remote_cache.tier().off_reason == str(warning.message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once
        _assert_local_cache_works("e2")


def test_a_connection_the_server_closed_while_idle_is_reopened(tmp_path, monkeypatch):
    with _server(tmp_path, "--timeout", "1") as port:  # the server closes clients idle for 1 s
        _use(monkeypatch, tmp_path, f"redis://127.0.0.1:{port}")
        path = disk_cache.entry("aot", "f1" + "0" * 62, ".pkl")
        disk_cache.write(path, b"entry")  # kiln's connection is open, then idle
        watcher = redis.Redis(port=port)
        deadline = time.monotonic() + 20
        while len(watcher.client_list()) > 1:  # until the server has closed kiln's
            assert time.monotonic() < deadline, "redis-server kept an idle client past its timeout"
            time.sleep(0.1)
        path.unlink()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert disk_cache.read(path) == b"entry"
        assert not remote_cache.tier().broken
