"""Which GEMM implementations the autotuner times: every one that can run the dtype, in the
default mode too; `backend.gemm_candidates` (KILN_GEMM_CANDIDATES) narrows them, ATen always
kept; and a question's key names the CPU's ISA, so CPUs sold under one name never share answers."""

import pytest
import torch

import kiln
from kiln import disk_cache
from kiln.autotune import gemm, store
from kiln.autotune.choose import _MEMORY, clear_memory
from kiln.externs.prepacked import MM_IMPLS


@pytest.fixture(autouse=True)
def private_cache(tmp_path):
    clear_memory()
    with kiln.config.patch({"cache.dir": str(tmp_path / "cache"), "backend.gemm_candidates": ()}):
        yield
    clear_memory()


def _runnable(dtype):
    """The MM_IMPLS entries that run a small GEMM in `dtype`, found by running each."""
    a, b = torch.randn(8, 64, dtype=dtype), torch.randn(64, 32, dtype=dtype)
    names = set()
    for name in MM_IMPLS:
        try:
            gemm.mm_call(name)(a, b, None, "none", [], None)
        except RuntimeError:
            continue
        names.add(name)
    return names


def _timed(dtype, post_op=("none", [], "")):
    """The choice and the candidates timed for one fresh GEMM question."""
    a, b = torch.empty(8, 64, dtype=dtype, device="meta"), torch.empty(64, 32, dtype=dtype, device="meta")
    choice = gemm.choose_mm(a, b, None, "default", post_op)
    (result,) = _MEMORY.values()
    assert result["choice"] == choice
    return choice, result["seconds"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_implementation_that_runs_the_dtype_is_timed(dtype):
    _, seconds = _timed(dtype)
    assert set(seconds) == _runnable(dtype)
    assert all(t < float("inf") for t in seconds.values())


def test_mkl_is_offered_in_the_default_mode_where_torch_has_it():
    assert ("mkl" in gemm.mm_impls(torch.float32)) == torch.backends.mkl.is_available()
    assert "mkl" not in gemm.mm_impls(torch.bfloat16)  # its packed GEMM is float32 only


def test_a_post_op_adds_the_fused_candidate():
    _, seconds = _timed(torch.float32, ("relu", [], ""))
    assert set(seconds) == _runnable(torch.float32) | set(gemm.FUSED_POST_OPS)  # oneDNN's and kiln's


def test_the_setting_narrows_the_candidates_and_keeps_aten():
    with kiln.config.patch({"backend.gemm_candidates": "onednn"}):
        _, seconds = _timed(torch.float32)
        assert set(seconds) == {"aten", "onednn"}
        clear_memory()
        _, seconds = _timed(torch.float32, ("relu", [], ""))
        assert set(seconds) == {"aten", "onednn", gemm.FUSED_POST_OP}  # oneDNN with and without its post-op
    with kiln.config.patch({"backend.gemm_candidates": "aten_kn,onednn_post_op"}):
        clear_memory()
        _, seconds = _timed(torch.float32, ("relu", [], ""))
        assert set(seconds) == {"aten", "aten_kn", gemm.FUSED_POST_OP}


def test_the_environment_variable_sets_the_candidates(tmp_path):
    with kiln.config.patch(kiln.config.as_dict()):  # puts every setting back afterwards
        kiln.config.reload_from_env({"KILN_GEMM_CANDIDATES": "mkl, onednn", "KILN_CACHE_DIR": str(tmp_path)})
        assert kiln.config.backend.gemm_candidates == ("mkl", "onednn")
        assert gemm.allowed_candidates() == {"aten", "mkl", "onednn"}


def test_an_unknown_candidate_is_an_error_naming_the_setting():
    gemm._warn_once.cache_clear()  # warned once per process: make this test's call the first
    with kiln.config.patch({"backend.gemm_candidates": "mkl,mlk"}):
        with pytest.warns(UserWarning), pytest.raises(ValueError) as error:
            gemm.mm_impls(torch.float32)
    message = str(error.value)
    assert "backend.gemm_candidates" in message and "KILN_GEMM_CANDIDATES" in message and "'mlk'" in message
    for name in (*MM_IMPLS, gemm.FUSED_POST_OP):
        assert name in message  # the accepted names


_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse sse2 fma avx avx2 avx512f avx512bw {extra}
"""


def test_the_key_names_the_isa_flags(monkeypatch):
    keys = []
    try:
        for extra in ("", "avx512_bf16", "avx512_bf16 amx_bf16 amx_tile", "avx512_bf16 amx_bf16 amx_tile sha_ni"):
            monkeypatch.setattr(disk_cache, "_cpuinfo", lambda extra=extra: _CPUINFO.format(extra=extra))
            disk_cache.cpu_identity.cache_clear()
            keys.append(store.question_key("mm", (1, 2), ["a", "b"]))
    finally:
        disk_cache.cpu_identity.cache_clear()
    assert len(set(keys[:3])) == 3  # one model name, three ISAs: three keys
    assert keys[3] == keys[2]  # a flag that does not decide GEMM speed changes nothing


def test_the_cpu_description_reads_aarch64_cpuinfo():
    text = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\nCPU implementer\t: 0x41\nCPU part\t: 0xd40\n"
    assert disk_cache.cpu_description(text) == "0x41 0xd40|asimd sve bf16"
