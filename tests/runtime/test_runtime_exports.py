"""kiln's runtime is loaded RTLD_GLOBAL (C++ wrappers find its functions there): it must put its
kiln_* functions in the process's global scope and nothing else. Before its version script it
exported ~150 c10/ATen inline functions, vtables and typeinfo, which then stood in for libtorch's
own (loaded RTLD_LOCAL) in every library loaded after it. That the wrappers still find the
kiln_* functions is what tests/backend/test_cpp_wrapper.py runs."""

import shutil
import subprocess

import pytest

from kiln.native import libkiln

# Symbols every shared library defines for the linker, not code or data of its own.
LINKER_MARKERS = {"_edata", "_end", "__bss_start", "_init", "_fini"}


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm (installed beside gcc)")
def test_the_runtime_exports_its_kiln_functions_only():
    listing = subprocess.run(["nm", "-D", "--defined-only", libkiln.library_path()], capture_output=True,
                             text=True, check=True).stdout
    names = {line.split()[-1] for line in listing.splitlines() if line.strip()}
    assert {"kiln_find_op", "kiln_call_op", "kiln_error", "kiln_empty_strided", "kiln_packed_bytes"} <= names
    assert sorted(n for n in names - LINKER_MARKERS if not n.startswith("kiln_")) == []

