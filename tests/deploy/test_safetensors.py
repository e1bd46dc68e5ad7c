"""kiln's own safetensors writer and reader: round trips, files the `safetensors` package reads
and writes (it comes with transformers, a test dependency), and truncated files refused."""

import pytest
import safetensors.torch
import torch

from kiln.deploy import safetensors as kiln_safetensors

TENSORS = {"a": torch.randn(3, 4), "ids": torch.arange(5), "transposed": torch.randn(2, 3).t(),
           "empty": torch.zeros(0, 3), "half": torch.randn(4).bfloat16(), "mask": torch.rand(6) > 0.5}


def test_what_kiln_writes_the_package_reads_and_the_other_way_round(tmp_path):
    path = tmp_path / "t.safetensors"
    kiln_safetensors.save(TENSORS, path)
    for loaded in (kiln_safetensors.load(path), safetensors.torch.load_file(path)):
        for name, t in TENSORS.items():
            assert torch.equal(loaded[name], t), name
    safetensors.torch.save_file({k: v.contiguous() for k, v in TENSORS.items()}, path)
    loaded = kiln_safetensors.load(path)
    for name, t in TENSORS.items():
        assert torch.equal(loaded[name], t), name


def test_a_truncated_file_is_refused(tmp_path):
    path = tmp_path / "t.safetensors"
    kiln_safetensors.save(TENSORS, path)
    data = path.read_bytes()
    path.write_bytes(data[:20])
    with pytest.raises(kiln_safetensors.SafetensorsError, match="truncated"):
        kiln_safetensors.load(path)
    path.write_bytes(data[:-8])
    with pytest.raises(kiln_safetensors.SafetensorsError, match="bytes outside the file"):
        kiln_safetensors.load(path)
