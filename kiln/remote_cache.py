"""A shared cache tier on Redis under the local disk cache (seed 002: a team or a fleet compiles
a model once): `KILN_REMOTE_CACHE=redis://host:port[/db]`.

kiln/disk_cache.py asks this tier on a local miss and, after every local write of a complete
entry (a build that succeeded), offers it the entry. What the tier stores is content-addressed:

    kiln:<version>:index:<kind>/<name>   ->  {"sha256": ..., "bytes": n, "hmac": ...}   (JSON)
    kiln:<version>:blob:<sha256>         ->  the entry's bytes

A read takes the index, then the blob, and keeps the blob only when its SHA-256 is the one the
index names and its length matches: a torn, truncated or overwritten blob is a miss, rebuilt
locally and reported (a warning, once per entry). The names are the local cache's own (their
keys already cover kiln's source, torch's version, the compiler and the CPU), so a machine only
ever reads what a machine of its kind wrote under the same key.

The cache holds shared libraries kiln loads, so whoever can write to the Redis server can run
code in every process that reads from it. With `KILN_REMOTE_CACHE_SECRET` set (the same value on
every machine of the team), each index entry carries an HMAC-SHA256 of its name and digest under
that secret and entries without a valid one are refused (reported): only holders of the secret
can add entries. Without a secret, use a Redis server only trusted machines can write.

The server being unreachable never fails a compile: the tier is switched off for the process
with one warning, and kiln compiles locally. The client is kiln's own (RESP over a socket, the
three commands it needs: PING, GET, SET).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import threading
import warnings
from urllib.parse import urlparse

from kiln import config, logs

# Bumped when the stored format changes, so old and new kilns sharing a server never mix.
FORMAT = "1"
TIMEOUT_S = 5.0

# What this process did with the tier, for tests and reports.
STATS = {"hits": 0, "misses": 0, "stored": 0, "rejected": 0}


class RemoteCacheError(Exception):
    """The server answered with an error, or the connection failed."""


class _Redis:
    """A minimal Redis client: one connection per thread, RESP2 requests and replies."""

    def __init__(self, host: str, port: int, db: int) -> None:
        self.host, self.port, self.db = host, port, db
        self._local = threading.local()

    def _connection(self) -> tuple[socket.socket, "socket.SocketIO"]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            sock = socket.create_connection((self.host, self.port), timeout=TIMEOUT_S)
            conn = self._local.conn = (sock, sock.makefile("rb"))
            if self.db:
                self._roundtrip(b"SELECT", str(self.db).encode())
        return conn

    def command(self, *parts: bytes) -> bytes | str | int | None:
        try:
            return self._roundtrip(*parts)
        except (OSError, RemoteCacheError):
            self.close()
            raise

    def _roundtrip(self, *parts: bytes) -> bytes | str | int | None:
        sock, reader = self._connection()
        request = [b"*%d\r\n" % len(parts)]
        for part in parts:
            request.append(b"$%d\r\n%s\r\n" % (len(part), part))
        sock.sendall(b"".join(request))
        return _reply(reader)

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn[1].close()
            conn[0].close()


def _reply(reader) -> bytes | str | int | None:
    line = reader.readline()
    if not line.endswith(b"\r\n"):
        raise RemoteCacheError("the connection closed mid-reply")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RemoteCacheError(rest.decode(errors="replace"))
    if kind == b":":
        return int(rest)
    if kind == b"$":
        size = int(rest)
        if size < 0:
            return None
        data = reader.read(size + 2)
        if len(data) != size + 2:
            raise RemoteCacheError("the connection closed mid-reply")
        return data[:-2]
    raise RemoteCacheError(f"unexpected reply {line[:40]!r}")


class RemoteTier:
    """The Redis tier named by a `redis://` URL."""

    def __init__(self, url: str) -> None:
        parsed = urlparse(url)
        if parsed.scheme != "redis" or not parsed.hostname:
            raise ValueError(f"cache.remote (KILN_REMOTE_CACHE) must be redis://host:port[/db]; got {url!r}")
        db = int(parsed.path.lstrip("/") or 0)
        self.url = url
        self.client = _Redis(parsed.hostname, parsed.port or 6379, db)
        self.prefix = f"kiln:{FORMAT}:"
        self.secret = os.environ.get("KILN_REMOTE_CACHE_SECRET", "").encode() or None
        self.broken = False  # set on the first connection failure: this process compiles locally
        self._reported: set[str] = set()

    # -- reading ---------------------------------------------------------------------------------
    def get(self, name: str) -> bytes | None:
        """The verified bytes of entry `name` (`<kind>/<file name>`), or None."""
        if self.broken:
            return None
        try:
            index = self.client.command(b"GET", self._index_key(name))
            if index is None:
                STATS["misses"] += 1
                return None
            meta = self._meta(name, index)
            if meta is None:
                return None
            blob = self.client.command(b"GET", self._blob_key(meta["sha256"]))
        except (OSError, RemoteCacheError) as error:
            self._switch_off(error)
            return None
        if not isinstance(blob, bytes) or len(blob) != meta["bytes"] or hashlib.sha256(blob).hexdigest() != meta["sha256"]:
            self._reject(name, "its bytes do not match the digest its index names (corrupt or overwritten)")
            return None
        STATS["hits"] += 1
        logs.log("cache", "remote cache hit %s (%d bytes)", name, len(blob))
        return blob

    def _meta(self, name: str, index: bytes) -> dict | None:
        try:
            meta = json.loads(index)
            digest, size = meta["sha256"], meta["bytes"]
            valid = isinstance(digest, str) and len(digest) == 64 and isinstance(size, int)
        except (ValueError, KeyError, TypeError):
            valid = False
        if not valid:
            self._reject(name, "its index entry is not kiln's")
            return None
        if self.secret is not None and not hmac.compare_digest(str(meta.get("hmac", "")), self._signature(name, digest)):
            self._reject(name, "its index entry is not signed with KILN_REMOTE_CACHE_SECRET")
            return None
        return meta

    # -- writing ---------------------------------------------------------------------------------
    def put(self, name: str, data: bytes) -> None:
        """Offer entry `name` (complete, written locally after a successful build) to the server."""
        if self.broken:
            return
        digest = hashlib.sha256(data).hexdigest()
        meta = {"sha256": digest, "bytes": len(data)}
        if self.secret is not None:
            meta["hmac"] = self._signature(name, digest)
        try:
            # The blob before the index that names it: a reader never finds an index without it.
            self.client.command(b"SET", self._blob_key(digest), data)
            self.client.command(b"SET", self._index_key(name), json.dumps(meta).encode())
        except (OSError, RemoteCacheError) as error:
            self._switch_off(error)
            return
        STATS["stored"] += 1
        logs.log("cache", "remote cache stored %s (%d bytes)", name, len(data))

    def delete(self, name: str) -> None:
        """Forget entry `name`: its index goes (the blob stays, unnamed, for whatever else shares
        its bytes), so no process loads it again."""
        if self.broken:
            return
        try:
            self.client.command(b"DEL", self._index_key(name))
        except (OSError, RemoteCacheError) as error:
            self._switch_off(error)
            return
        logs.log("cache", "remote cache entry %s deleted", name)

    # -- helpers ---------------------------------------------------------------------------------
    def _index_key(self, name: str) -> bytes:
        return f"{self.prefix}index:{name}".encode()

    def _blob_key(self, digest: str) -> bytes:
        return f"{self.prefix}blob:{digest}".encode()

    def _signature(self, name: str, digest: str) -> str:
        return hmac.new(self.secret or b"", f"{name}\0{digest}".encode(), hashlib.sha256).hexdigest()

    def _reject(self, name: str, why: str) -> None:
        STATS["rejected"] += 1
        message = f"kiln: the remote cache entry {name} at {self.url} was refused: {why}; it is rebuilt locally"
        logs.log("cache", "%s", message)
        if name not in self._reported:
            self._reported.add(name)
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    def _switch_off(self, error: Exception) -> None:
        self.broken = True
        message = (f"kiln: the remote cache {self.url} is unreachable or failed ({type(error).__name__}: {error}); "
                   f"this process compiles locally")
        logs.log("cache", "%s", message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


_TIERS: dict[str, RemoteTier] = {}


def tier() -> RemoteTier | None:
    """The remote tier the setting `cache.remote` names, or None when it is empty."""
    url = config.cache.remote
    if not url:
        return None
    found = _TIERS.get(url)
    if found is None:
        found = _TIERS[url] = RemoteTier(url)
    return found
