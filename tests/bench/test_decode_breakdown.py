"""benchmarks/tools/decode_breakdown.py: a decode step's time cut at kiln's passage points."""
import pytest
import torch

from benchmarks.llm_modes import LLM_MODELS
from benchmarks.tools import decode_breakdown
from kiln.capture import cache as frame_cache


def _call(t0: int, **offsets: int) -> dict[str, int]:
    return {name: t0 + offset for name, offset in offsets.items()}


def test_each_segment_is_the_median_over_the_decode_steps_of_every_round():
    marks = dict(guards=1_000, guarded=3_000, stamp=4_000, stamped=5_000, graph=6_000, graphed=106_000, returned=110_000)
    prefill = _call(0, call=0, **{k: 10 * v for k, v in marks.items()})  # (a generate's first call: not a step)
    rounds = [[prefill, _call(2_000_000, call=0, **marks), _call(2_300_000, call=0, **marks)],
              [prefill, _call(3_000_000, call=0, **marks), _call(3_500_000, call=0, **marks)]]
    result = decode_breakdown.breakdown(rounds)
    assert result.segments == {"entry: arguments bound": 1.0, "guard check": 2.0, "down to the frozen program": 1.0,
                               "frozen weights' stamp": 1.0, "to the graph": 1.0, "graph": 100.0,
                               "back to the loop": 4.0}
    assert result.step_ms == [0.3, 0.5]  # call to call
    assert result.loop_us == pytest.approx((190.0 + 390.0) / 2)  # a step's return to the next call
    assert "steps: median 0.40 ms, mean 0.40, 90th percentile 0.50" in result.lines()[-1]  # (the nearest rank)


def test_a_tiny_models_int4_steps_are_cut_and_its_products_timed_and_everything_put_back(capsys):
    decode_breakdown.main(["--model", "llama-tiny", "--mode", "kiln-int4", "--prompt", "8", "--new", "5",
                           "--rounds", "2", "--threads", "1", "--products"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("llama-tiny · kiln-int4 · 1 threads: prompt 8, 5 new tokens, 2 rounds")
    timed = {line.rsplit(None, 2)[0].strip(): float(line.rsplit(None, 2)[1]) for line in lines[1:9]}
    assert set(timed) == {"decoding loop, between steps", *(name for name, _, _ in decode_breakdown.SEGMENTS)}
    assert all(us > 0 for us in timed.values())
    assert "(6 steps)" in lines[9]  # 4 calls after each prefill, 3 steps from call to call; 2 rounds
    assert "the step's int4 products alone" in lines[10] and float(lines[10].split("median ")[1].split()[0]) > 0
    # The wrappers are gone: the class's call and every entry's guard check are their own again.
    assert LLM_MODELS["llama-tiny"].build().__class__.__call__ is torch.nn.Module.__call__
    assert all("timed" not in entry.guards.check.__qualname__ for cache in frame_cache.all_caches()
               for entry in cache.entries)


def test_products_asks_for_a_quantized_mode(capsys):
    with pytest.raises(SystemExit):
        decode_breakdown.main(["--model", "llama-tiny", "--mode", "kiln", "--products"])
    assert "--products times quantized products: --mode kiln stores fp32 weights" in capsys.readouterr().err


def test_again_puts_each_repeat_after_the_segment_it_repeats_and_in_no_other():
    marks = dict(guards=1_000, guarded=3_000, guards_again=3_100, guarded_again=3_600, stamp=4_000, stamped=5_000,
                 stamp_again=5_000, stamped_again=5_200, graph=6_000, graphed=106_000, returned=110_000)
    prefill = _call(0, call=0, **marks)
    result = decode_breakdown.breakdown([[prefill, _call(1_000_000, call=0, **marks), _call(1_200_000, call=0, **marks)]],
                                        again=True)
    assert list(result.segments.items()) == [
        ("entry: arguments bound", 1.0), ("guard check", 2.0), ("guard check, run again at once", 0.5),
        ("down to the frozen program", 0.4), ("frozen weights' stamp", 1.0),
        ("frozen weights' stamp, run again at once", 0.2), ("to the graph", 0.8), ("graph", 100.0),
        ("back to the loop", 4.0)]
    assert decode_breakdown.step_segments() == decode_breakdown.SEGMENTS


def test_again_times_a_tiny_models_guard_check_and_stamp_twice(capsys):
    decode_breakdown.main(["--model", "llama-tiny", "--mode", "kiln-int4", "--prompt", "8", "--new", "4",
                           "--rounds", "1", "--threads", "1", "--again"])
    lines = capsys.readouterr().out.splitlines()
    timed = {line.rsplit(None, 2)[0].strip(): float(line.rsplit(None, 2)[1]) for line in lines[1:11]}
    assert list(timed) == ["decoding loop, between steps", *(name for name, _, _ in decode_breakdown.step_segments(True))]
    assert all(us > 0 for us in timed.values())
    assert "(2 steps)" in lines[11]  # 3 calls after the prefill
