"""Tests of the runtime as a long-lived process sees it: soak, recompile storms, a cache shared
by concurrent processes, the cache directory's safety."""
