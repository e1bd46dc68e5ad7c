"""benchmarks/tools/quant_decode_sweep.py: a decode step's quantized products per build, on the suite's tiny model."""
import pytest
import torch

from benchmarks import kernels
from benchmarks.tools import quant_decode_sweep


def test_every_kind_of_a_decode_steps_products_is_timed(capsys):
    layer = [(64, 128), (64, 64), (64, 256), (128, 64)]  # q/k/v merged (4 heads over 2), o, gate/up merged, down
    assert quant_decode_sweep.layer_shapes("llama-tiny") == layer * 2 + [(64, 1000)]
    quant_decode_sweep.main(["--model", "llama-tiny", "--rounds", "1", "--threads", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert "llama-tiny: 9 products a step" in lines[0]
    timed = {line.split()[1]: float(line.split()[-2]) for line in lines[1:]}
    assert set(timed) == set(quant_decode_sweep.KINDS) and all(gbps > 0 for gbps in timed.values())


def test_an_unknown_kind_is_refused(capsys):
    with pytest.raises(SystemExit):
        quant_decode_sweep.main(["--kinds", "int4,fp8"])
    assert "--kinds: accepted kinds are fp32, int8, int4, int4-a8, read-fp32, read-int8, read-int4, got 'int4,fp8'" in capsys.readouterr().err


def test_the_packed_weights_can_lie_on_huge_pages(capsys):
    """--huge-pages: each packed weight copied into memory advised as 2 MB pages, read where it lies."""
    arena = quant_decode_sweep.HugePageArena(3 * 4096)
    first, second = torch.arange(10, dtype=torch.uint8), torch.randn(3, 5)
    laid = [arena.copy_of(first), arena.copy_of(second)]
    assert torch.equal(laid[0], first) and torch.equal(laid[1], second)
    assert laid[1].data_ptr() - laid[0].data_ptr() == 4096  # each at a page of its own
    quant_decode_sweep.main(["--model", "llama-tiny", "--rounds", "1", "--threads", "1", "--kinds", "int4", "--huge-pages"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].split()[:2] == ["default", "int4"] and float(lines[1].split()[-2]) > 0
    assert kernels.library().kiln_gemm_huge_page_packs() == 0  # the process's setting put back


def test_the_same_packs_are_timed_on_both_page_sizes_and_every_reading(capsys):
    before = kernels.library().kiln_gemm_near_gemv()
    quant_decode_sweep.main(["--model", "llama-tiny", "--rounds", "4", "--threads", "1", "--kinds", "fp32,int4", "--pages"])
    lines = capsys.readouterr().out.splitlines()[1:]
    rows = {(line.split()[0], line.split()[1]): line for line in lines}
    readings = ("2mb-pages-runs", "2mb-pages-plain-runs", "2mb-pages-amd-reads")
    assert set(rows) == {(v, k) for v in ("default", *readings) for k in ("fp32", "int4")}
    assert all("x the default's time" in rows[(v, k)] for v in readings for k in ("fp32", "int4"))
    assert kernels.library().kiln_gemm_huge_page_packs() == 0  # the process's settings put back
    assert kernels.library().kiln_gemm_near_gemv() == before


def test_pages_takes_no_builds(capsys):
    with pytest.raises(SystemExit):
        quant_decode_sweep.main(["--pages", "KILN_DIGIT_RUNS=1"])
    assert "--pages compares page layouts of the default build" in capsys.readouterr().err


def test_huge_page_runs_lays_the_packs_on_2mb_pages_and_reads_them_in_runs(capsys, monkeypatch):
    """--huge-page-runs: the packs copied to 2 MB pages as --huge-pages does, but huge_page_packs
    left off and near_gemv on while they are read (Intel's reading), where --huge-pages turns
    huge_page_packs on and near_gemv off (AMD's)."""
    settings: dict[str, list[tuple[str, int]]] = {}

    class Recording:  # a build whose reading settings are recorded
        def __init__(self, lib, name):
            self._lib, self._name = lib, name

        def __getattr__(self, attr):
            return getattr(self._lib, attr)

        def kiln_gemm_set_huge_page_packs(self, on):
            settings.setdefault(self._name, []).append(("huge", on))
            self._lib.kiln_gemm_set_huge_page_packs(on)

        def kiln_gemm_set_near_gemv(self, on):
            settings.setdefault(self._name, []).append(("near", on))
            self._lib.kiln_gemm_set_near_gemv(on)

    build = quant_decode_sweep.build_variant
    monkeypatch.setattr(quant_decode_sweep, "build_variant", lambda macros: Recording(build(macros), "+".join(macros)))
    copied = []
    copy_of = quant_decode_sweep.HugePageArena.copy_of
    monkeypatch.setattr(quant_decode_sweep.HugePageArena, "copy_of", lambda self, t: copied.append(t) or copy_of(self, t))
    near_before = kernels.library().kiln_gemm_near_gemv()
    for flag, reading in (("--huge-page-runs", [("huge", 0), ("near", 1)]), ("--huge-pages", [("huge", 1), ("near", 0)])):
        settings.clear()
        copied.clear()
        quant_decode_sweep.main(["--model", "llama-tiny", "--rounds", "2", "--threads", "1", "--kinds", "int4", flag,
                                 "KILN_NEAR_UNITS=0"])
        rows = capsys.readouterr().out.splitlines()[1:]
        assert [row.split()[:2] for row in rows] == [["default", "int4"], ["KILN_NEAR_UNITS=0", "int4"]]
        assert settings[""][:4] == reading * 2 and settings["KILN_NEAR_UNITS=0"][:4] == reading * 2
        assert len(copied) == 9 * 3  # every product's fp32, int8 and int4 packs
    assert kernels.library().kiln_gemm_huge_page_packs() == 0
    assert kernels.library().kiln_gemm_near_gemv() == near_before


def test_huge_pages_and_huge_page_runs_are_one_or_the_other(capsys):
    with pytest.raises(SystemExit):
        quant_decode_sweep.main(["--huge-pages", "--huge-page-runs"])
    assert "--huge-pages and --huge-page-runs are two readings of the same pages" in capsys.readouterr().err


def test_a_step_in_one_c_call_computes_what_each_product_computes():
    """kiln_gemm_quant_step (--in-c) runs each product as kiln_gemm_quant_f32 does, into its own output."""
    import ctypes

    lib = kernels.library()
    torch.manual_seed(0)
    shapes = [(64, 128), (128, 64), (96, 200)]  # (K, N)
    packs, acts, outs, want = [], [], [], []
    for k, n in shapes:
        w = torch.randn(n, k) * 0.02
        packs.append(kernels.quant_pack(*quant_decode_sweep._int4(w, 32), 4, 32, k, lib))
        acts.append(torch.randn(1, k))
        outs.append(torch.full((1, n), float("nan")))
        want.append(kernels.mm_quant(acts[-1], packs[-1], n, 4, 32, lib=lib))
    int64s = lambda values: (ctypes.c_int64 * len(values))(*values)  # noqa: E731
    pointers = lambda ts: (ctypes.c_void_p * len(ts))(*[t.data_ptr() for t in ts])  # noqa: E731
    ns = (ctypes.c_double * 3)()
    lib.kiln_gemm_quant_step(3, 4, 1, int64s([n for _, n in shapes]), int64s([k for k, _ in shapes]), int64s([32] * 3),
                             pointers(acts), pointers(packs), pointers(outs), kernels.K_BLOCK, ns)
    assert all(torch.equal(out, expected) for out, expected in zip(outs, want))
    assert all(t > 0 for t in ns)
    read_ns = (ctypes.c_double * 3)()
    lib.kiln_read_pieces(3, pointers(packs), int64s([p.numel() for p in packs]), 2, 256, read_ns)
    assert all(t > 0 for t in read_ns)
    # bits 32: float32's GEMM over its own panels, as kiln_gemm_f32 computes it.
    panels = [kernels.pack(torch.randn(k, n), lib=lib) for k, n in shapes]
    fp32_want = [kernels.mm(a, p, n, lib=lib) for a, p, (_, n) in zip(acts, panels, shapes)]
    lib.kiln_gemm_quant_step(3, 32, 1, int64s([n for _, n in shapes]), int64s([k for k, _ in shapes]), int64s([0] * 3),
                             pointers(acts), pointers(panels), pointers(outs), kernels.K_BLOCK, ns)
    assert all(torch.equal(out, expected) for out, expected in zip(outs, fp32_want))


def test_in_c_times_each_kinds_step_and_each_shape(capsys):
    quant_decode_sweep.main(["--model", "llama-tiny", "--rounds", "2", "--threads", "2", "--kinds",
                             "int4,read-int4,int8,read-int8", "--huge-page-runs", "--in-c", "--read-runs", "4"])
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[1]: float(line.split()[-2]) for line in lines[1:5]}
    assert set(rows) == {"int4", "read-int4", "int8", "read-int8"} and all(gbps > 0 for gbps in rows.values())
    shapes = [line.split() for line in lines[5:]]
    kinds = ("int4", "read-int4", "int8", "read-int8")  # (each in-C kind's shapes, the reads' too)
    assert [(s[0], s[1], s[2]) for s in shapes] == [("default", kind, f"{k}x{n}:") for kind in kinds
                                                   for k, n in [(64, 128), (64, 64), (64, 256), (128, 64), (64, 1000)]]
    assert [s[3] for s in shapes] == ["2", "2", "2", "2", "1"] * 4  # products of each shape a step
    assert all(float(s[-2]) > 0 for s in shapes)  # GB/s


def test_in_c_times_the_kinds_it_has_no_call_for_a_product_at_a_time(capsys, monkeypatch):
    """--in-c: float32's products in one C call beside the plain read of their packs (read-fp32);
    int4 with int8 activations, which has no step in C, each product through its own call."""
    calls = []
    mm, mm_quant = kernels.mm, kernels.mm_quant
    monkeypatch.setattr(kernels, "mm", lambda *args, **kw: calls.append("fp32") or mm(*args, **kw))
    monkeypatch.setattr(kernels, "mm_quant", lambda *args, **kw: calls.append("int4-a8") or mm_quant(*args, **kw))
    quant_decode_sweep.main(["--model", "llama-tiny", "--rounds", "2", "--threads", "1", "--kinds",
                             "fp32,read-fp32,int4-a8", "--in-c"])
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[1]: float(line.split()[-2]) for line in lines[1:4]}
    assert set(rows) == {"fp32", "read-fp32", "int4-a8"} and all(gbps > 0 for gbps in rows.values())
    assert calls == ["int4-a8"] * (2 * 9)  # every round's 9 products, one call each
    assert {line.split()[1] for line in lines[4:]} == {"fp32", "read-fp32"}  # the in-C kinds' shapes


def test_rounds_are_told_apart_by_the_state_their_probes_read():
    """A round belongs to the state both its probes read (within BRACKET_AGREEMENT); a round whose
    probes disagree (the machine changed state while it ran) to neither."""
    probes = [60.0, 61.0, 34.0, 33.0, 62.0, 60.0, 58.0, 35.0]
    assert quant_decode_sweep.rounds_by_state(probes) == {"high": [0, 4, 5], "low": [2]}
    # One steady state: every round high (a share of the best probe, not of a fixed bandwidth).
    assert quant_decode_sweep.rounds_by_state([20.0, 21.0, 20.5]) == {"high": [0, 1], "low": []}


def test_by_state_gives_each_builds_ratio_over_each_states_rounds(capsys, monkeypatch):
    """--by-state probes before the first round and after each, and prints, per state, the default's
    time and each build's median ratio over that state's rounds alone."""
    readings = iter([60.0, 61.0, 34.0, 33.0, 60.0, 62.0])  # rounds 0 and 4 high, 2 low, 1 and 3 in neither
    calls = []

    def read_bandwidth(threads, passes, buffer):
        calls.append((threads, passes, buffer))
        return next(readings)

    monkeypatch.setattr(quant_decode_sweep, "probe_buffer", lambda: "the buffer")
    monkeypatch.setattr(quant_decode_sweep, "read_bandwidth", read_bandwidth)
    quant_decode_sweep.main(["--model", "llama-tiny", "--rounds", "5", "--threads", "1", "--kinds", "int4",
                             "--by-state", "KILN_NEAR_UNITS=0"])
    lines = capsys.readouterr().out.splitlines()
    assert calls == [(1, quant_decode_sweep.ROUND_PROBE_PASSES, "the buffer")] * 6
    at = lines.index("high state: 2 rounds whose probes read 60.5-61.0 GB/s")
    assert lines[at + 1].split()[:2] == ["default", "int4"] and float(lines[at + 1].split()[-2]) > 0
    assert lines[at + 2].split()[:2] == ["KILN_NEAR_UNITS=0", "int4"] and "x the default's time (quartiles" in lines[at + 2]
    low = lines.index("low state: 1 rounds whose probes read 33.5-33.5 GB/s")
    assert lines[low + 2].endswith("x the default's time")  # one round: no quartiles
