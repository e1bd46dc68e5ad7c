"""benchmarks/tools/quant_decode_sweep.py: a decode step's quantized products per build, on the suite's tiny model."""
import pytest

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
    assert "--kinds: accepted kinds are fp32, int8, int4, int4-a8, got 'int4,fp8'" in capsys.readouterr().err
