import pytest

from kiln.runtime import fallback


@pytest.fixture(autouse=True)
def no_silent_fallbacks():
    """A graph that fell back to eager is a failure unless the test expects it (and clears it)."""
    fallback.reset()
    yield
    assert not fallback.FALLBACKS, [str(f) for f in fallback.FALLBACKS]
