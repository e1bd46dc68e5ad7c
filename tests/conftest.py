import os
import tempfile

# Benchmark models are built from configs; nothing may reach for the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# kiln's own libraries (its runtime over libtorch, its CPython extension: ~25 s to build) depend only
# on the machine, compiler, torch and Python: built once per test run, shared by every test's
# private cache (xdist workers inherit the folder from the controller), never in the user's home.
if not os.environ.get("KILN_RUNTIME_CACHE_DIR"):
    os.environ["KILN_RUNTIME_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-test-runtime-")

# Every other cache a test run writes (compiled graphs, kernels, autotuning answers, Triton's
# binaries) in one temporary folder too, shared by the run's tests: never the user's home, whose
# entries from earlier runs would also turn a test's compile into a cache hit. Tests that need an
# empty cache of their own patch `cache.dir` per test (tests/kiln_backend.py `private_cache`).
if not os.environ.get("KILN_CACHE_DIR"):
    os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-test-cache-")
