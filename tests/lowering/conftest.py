import pytest

import kiln


@pytest.fixture(autouse=True, scope="session")
def private_kernel_cache(tmp_path_factory):
    # C++ kernels compiled by these tests go to a throwaway cache, not the user's.
    with kiln.config.patch({"cache.dir": str(tmp_path_factory.mktemp("kiln_cache"))}):
        yield
