"""A shared cache tier on Redis under the local disk cache (seed 002: a team or a fleet compiles
a model once): `KILN_REMOTE_CACHE=redis://[[user]:password@]host[:port][/db]`, or `rediss://...`
for TLS.

kiln/disk_cache.py asks this tier on a local miss and, after every local write of a complete
entry (a build that succeeded), offers it the entry. What the tier stores is content-addressed:

    kiln:<version>:index:<kind>/<name>   ->  {"sha256": ..., "bytes": n, "hmac": ...}   (JSON)
    kiln:<version>:blob:<sha256>         ->  the entry's bytes

A read takes the index, then the blob, and keeps the blob only when its SHA-256 is the one the
index names and its length matches: a torn, truncated or overwritten blob is a miss, rebuilt
locally and reported (a warning, once per entry). The names are the local cache's own, and
their keys name what the entry depends on (kiln/disk_cache.py): C++ libraries their sources, the
compiler and what `-march=native` resolves to; compiled graphs kiln's source (every file of it)
and torch's version; every entry that holds a machine's decisions -- autotuning answers, the
compiled graphs that carry them -- the CPU's model and ISA (`disk_cache.cpu_identity`) and the
thread count. So a machine only ever reads what a machine of its kind wrote under the same key.

The cache holds shared libraries kiln loads, so whoever can write to the Redis server can run
code in every process that reads from it. With `KILN_REMOTE_CACHE_SECRET` set (the same value on
every machine of the team), each index entry carries an HMAC-SHA256 of its name and digest under
that secret and entries without a valid one are refused (reported): only holders of the secret
can add entries. Without a secret, use a Redis server only trusted machines can write; a password
in the URL (Redis AUTH, or an ACL user) and `rediss://` (TLS) keep others off the server and the
wire.

The client is redis-py (the `redis` package, kiln's `remote` extra: `pip install kiln[remote]`):
it does AUTH and ACL users, TLS with certificate checks, connect and read timeouts, a connection
pool shared by threads and reset in forked children, which kiln's own RESP client (PING, GET,
SET over a plain socket) did not. It is optional because only this tier needs it; it is imported
when a remote URL is first used, so `import kiln` never loads it. Without it, a configured URL
gives one warning naming the extra and the process caches locally.

No failure of the server fails a compile: unreachable, a timeout, refused credentials, a TLS
handshake that fails, an error reply. The first switches the tier off for the process, with one
warning and the reason kept in `RemoteTier.off_reason`, and kiln compiles locally. A user the
server's ACL lets read but not write reads on: its first refused write is reported once and the
process stops offering entries. A malformed URL or timeout is a configuration error, raised
(ValueError naming the setting) at first use.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
import warnings
from urllib.parse import urlsplit

from kiln import config, logs

# Bumped when the stored format changes, so old and new kilns sharing a server never mix.
FORMAT = "1"

# What this process did with the tier, for tests and reports.
STATS = {"hits": 0, "misses": 0, "stored": 0, "rejected": 0}

FORMS = "redis://[[user]:password@]host[:port][/db], or rediss://... for TLS"
INSTALL = "pip install 'kiln[remote]' (or pip install 'redis>=5')"


def shown(url: str) -> str:
    """`url` with its password, if any, as *** (for messages and logs)."""
    return config._without_password(url)


def _check_url(url: str) -> None:
    """Raise ValueError naming the setting and the accepted forms unless `url` is one of them."""
    problem = None
    try:
        parsed = urlsplit(url)
        parsed.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError as error:
        problem = str(error)
    else:
        db = parsed.path.lstrip("/")
        if parsed.scheme not in ("redis", "rediss"):
            problem = "the scheme must be redis or rediss"
        elif not parsed.hostname:
            problem = "it names no host"
        elif db and not db.isdigit():
            problem = f"the database {db!r} is not a number"
    if problem is not None:
        raise ValueError(f"cache.remote (KILN_REMOTE_CACHE) must be {FORMS}; got {shown(url)!r} ({problem})")


def _timeout(name: str) -> float:
    value = getattr(config.cache, name)
    if not value > 0:
        spec = config._all_specs()[f"cache.{name}"]
        raise ValueError(f"cache.{name} ({spec.env}) must be a number of seconds above 0; got {value!r}")
    return value


def _client(url: str):
    """A redis-py client for `url`, or ImportError when redis-py is not installed. Nothing
    connects yet: the first command does."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # At most one retry, at once (redis-py 6 on; 5 does not retry): a connection lost mid-command
    # gets a second chance before the tier goes off, and a server that is down costs two connection
    # attempts, not the default's three with backoff. (The pool itself reopens a pooled connection
    # the server closed while it was idle.)
    # Options in the URL's query (?socket_timeout=, ?ssl_ca_certs=, ...) win over these.
    options = {"socket_connect_timeout": _timeout("remote_connect_timeout_s"),
               "socket_timeout": _timeout("remote_timeout_s"), "retry": Retry(NoBackoff(), 1)}
    if url.startswith("rediss:"):
        options["ssl_check_hostname"] = True  # the default from redis-py 6 on; 5 did not check
    try:
        return redis.Redis.from_url(url, **options)
    except ValueError as error:  # an option in the URL's query redis-py cannot parse
        raise ValueError(f"cache.remote (KILN_REMOTE_CACHE) {shown(url)!r}: {error}") from None


def _errors() -> tuple[type[BaseException], ...]:
    """What a failed command raises: redis-py's errors (connection, timeout, authentication,
    error replies) and the OS's (TLS handshakes, sockets)."""
    import redis

    return (redis.RedisError, OSError)


def _is_no_permission(error: BaseException) -> bool:
    """Whether `error` is the server refusing this user a command its ACL does not allow."""
    from redis import exceptions

    return isinstance(error, getattr(exceptions, "NoPermissionError", ())) or str(error).startswith("NOPERM")


class RemoteTier:
    """The Redis tier named by a `redis://` or `rediss://` URL."""

    def __init__(self, url: str) -> None:
        _check_url(url)
        self.url = url
        self.prefix = f"kiln:{FORMAT}:"
        self.secret = os.environ.get("KILN_REMOTE_CACHE_SECRET", "").encode() or None
        self.broken = False  # set on the first failure: this process compiles locally
        self.read_only = False  # set when the server's ACL refuses kiln's user a write
        self.off_reason: str | None = None  # why, once broken
        self._lock = threading.Lock()
        self._reported: set[str] = set()
        try:
            self.client = _client(url)
            self._failures = _errors()
        except ImportError as error:
            self.client = None
            self._failures = ()
            self._off(f"kiln: cache.remote (KILN_REMOTE_CACHE) is set to {shown(url)}, but the Redis client kiln "
                      f"uses is not installed ({error}); {INSTALL} to use it. This process caches locally",
                      stacklevel=5)

    # -- reading ---------------------------------------------------------------------------------
    def get(self, name: str) -> bytes | None:
        """The verified bytes of entry `name` (`<kind>/<file name>`), or None."""
        if self.broken:
            return None
        try:
            index = self.client.get(self._index_key(name))
            if index is None:
                STATS["misses"] += 1
                return None
            meta = self._meta(name, index)
            if meta is None:
                return None
            blob = self.client.get(self._blob_key(meta["sha256"]))
        except self._failures as error:
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
        if self.broken or self.read_only:
            return
        digest = hashlib.sha256(data).hexdigest()
        meta = {"sha256": digest, "bytes": len(data)}
        if self.secret is not None:
            meta["hmac"] = self._signature(name, digest)
        try:
            # The blob before the index that names it: a reader never finds an index without it.
            self.client.set(self._blob_key(digest), data)
            self.client.set(self._index_key(name), json.dumps(meta).encode())
        except self._failures as error:
            self._write_failed(error)
            return
        STATS["stored"] += 1
        logs.log("cache", "remote cache stored %s (%d bytes)", name, len(data))

    def delete(self, name: str) -> None:
        """Forget entry `name`: its index goes (the blob stays, unnamed, for whatever else shares
        its bytes), so no process loads it again."""
        if self.broken or self.read_only:
            return
        try:
            self.client.delete(self._index_key(name))
        except self._failures as error:
            self._write_failed(error)
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
        message = f"kiln: the remote cache entry {name} at {shown(self.url)} was refused: {why}; it is rebuilt locally"
        logs.log("cache", "%s", message)
        if name not in self._reported:
            self._reported.add(name)
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    def _write_failed(self, error: BaseException) -> None:
        """A write the server's ACL does not allow this user (a reader's account: Redis's own way
        to let only some machines write) stops writes, not reads; any other failure, everything."""
        if not _is_no_permission(error):
            self._switch_off(error)
            return
        with self._lock:
            if self.read_only:
                return
            self.read_only = True
        message = (f"kiln: the remote cache {shown(self.url)} does not let kiln's user write "
                   f"({type(error).__name__}: {error}); this process only reads from it")
        logs.log("cache", "%s", message)
        warnings.warn(message, RuntimeWarning, stacklevel=5)

    def _switch_off(self, error: BaseException) -> None:
        from redis import exceptions

        refused = tuple(getattr(exceptions, name) for name in (
            "AuthenticationError", "AuthenticationWrongNumberOfArgsError", "AuthorizationError", "NoPermissionError",
        ) if hasattr(exceptions, name))
        if isinstance(error, refused):
            what = ("refused kiln's credentials or what they allow (the user and password in cache.remote, "
                    "KILN_REMOTE_CACHE)")
        else:
            what = "is unreachable or failed"
        self._off(f"kiln: the remote cache {shown(self.url)} {what} ({type(error).__name__}: {error}); "
                  f"this process compiles locally", stacklevel=5)

    def _off(self, message: str, stacklevel: int) -> None:
        """Switch the tier off for the process, reporting why once (threads may fail together)."""
        with self._lock:
            if self.broken:
                return
            self.broken = True
            self.off_reason = message
        logs.log("cache", "%s", message)
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)


_TIERS: dict[tuple[str, float, float], RemoteTier] = {}  # by URL and timeouts


def tier() -> RemoteTier | None:
    """The remote tier the setting `cache.remote` names, or None when it is empty."""
    url = config.cache.remote
    if not url:
        return None
    key = (url, config.cache.remote_connect_timeout_s, config.cache.remote_timeout_s)
    found = _TIERS.get(key)
    if found is None:
        found = _TIERS[key] = RemoteTier(url)
    return found
