"""The OpInfo tests compile C++ kernels: into one throwaway cache for the session, never the user's."""

import pytest

import kiln


@pytest.fixture(autouse=True, scope="session")
def private_kernel_cache(tmp_path_factory):
    with kiln.config.patch({"cache.dir": str(tmp_path_factory.mktemp("kiln_cache"))}):
        yield
