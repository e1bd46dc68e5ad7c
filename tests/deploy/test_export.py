"""kiln.export and kiln.load: a model compiled ahead of time into a directory (one library with
kiln's runtime, the weights as safetensors, metadata) that a fresh process runs without compiling;
clear errors for wrong inputs, corrupted files, another ISA or version, and graph breaks."""

import json
import mmap
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kiln
from kiln import logs
from kiln.deploy import ArtifactError
from kiln.deploy import safetensors

from tests.kiln_backend import kiln_wherever_offered  # noqa: F401  (fixture)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module", autouse=True)
def module_cache(tmp_path_factory):
    """One cache for the module: kiln's runtime (about 10 s to build) is compiled once."""
    with kiln.config.patch({"cache.dir": str(tmp_path_factory.mktemp("cache"))}):
        yield


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)).eval()


@pytest.fixture(scope="module")
def mlp_artifact(tmp_path_factory):
    model = _mlp()
    path = kiln.export(model, (torch.randn(3, 16),), path=tmp_path_factory.mktemp("art") / "mlp")
    return model, path


def test_an_exported_mlp_runs_from_its_directory(mlp_artifact):
    model, path = mlp_artifact
    assert sorted(p.name for p in path.iterdir()) == ["metadata.json", "model.so", "weights.safetensors"]
    run = kiln.load(path)
    x = torch.randn(3, 16)
    with torch.no_grad():
        want = model(x)
    (got,) = run(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    (named,) = run(arg0=x)
    torch.testing.assert_close(named, want, rtol=1e-4, atol=1e-4)


def _tiny_bert():
    import transformers

    config = transformers.BertConfig(hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                     max_position_embeddings=128, vocab_size=1000, num_hidden_layers=2)
    return transformers.BertModel(config).eval()


def test_tiny_bert_with_input_ids_and_attention_mask(tmp_path):
    model = _tiny_bert()
    g = torch.Generator().manual_seed(0)
    ids, mask = torch.randint(0, 1000, (2, 12), generator=g), torch.ones(2, 12, dtype=torch.int64)
    mask[1, 7:] = 0
    run = kiln.load(kiln.export(model, (), {"input_ids": ids, "attention_mask": mask}, path=tmp_path / "bert"))
    assert [i["name"] for i in run.inputs] == ["input_ids", "attention_mask"]
    other = torch.randint(0, 1000, (2, 12), generator=g)
    last_hidden_state, pooler_output = run(input_ids=other, attention_mask=mask)
    with torch.no_grad():
        want = model(input_ids=other, attention_mask=mask)
    torch.testing.assert_close(last_hidden_state, want.last_hidden_state, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pooler_output, want.pooler_output, rtol=1e-4, atol=1e-4)


class TinyResNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
        self.block = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                         torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8))
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = self.stem(x)
        y = torch.relu(self.block(y) + y)
        return self.head(y.mean((2, 3)))


def test_a_tiny_resnet(tmp_path):
    torch.manual_seed(0)
    model = TinyResNet().eval()
    for m in model.modules():  # BatchNorm statistics that are not the identity
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    run = kiln.load(kiln.export(model, (torch.randn(2, 3, 16, 16),), path=tmp_path / "resnet"))
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(run(x)[0], model(x), rtol=1e-4, atol=1e-4)


def test_a_pre_norm_block_with_its_rms_norm_inside_kiln_gemm(tmp_path, kiln_wherever_offered, caplog):
    """An exported Llama block whose RMS norm runs inside kiln's GEMM (kiln::mm_add_layer_norm,
    rms=True) serves other inputs through the artifact's own runtime, flag and all."""
    from tests.codegen.test_gemm_layer_norm import _PreRmsNorm

    torch.manual_seed(0)
    model, h, x = _PreRmsNorm("llama").eval(), torch.randn(1, 10, 64), torch.randn(1, 10, 48) + 3.0
    logs.set_logs("freezing")
    try:
        run = kiln.load(kiln.export(model, (h, x), path=tmp_path / "rms"))
    finally:
        logs.set_logs([])
    assert any("RMS norm inside kiln's GEMM" in r.getMessage() for r in caplog.records)
    h2, x2 = torch.randn(1, 10, 64), torch.randn(1, 10, 48) - 2.0
    with torch.no_grad():
        for got, want in zip(run(h2, x2), model(h2, x2)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_kiln_load_uses_the_mapped_weights_in_place_where_their_layout_is_the_stored_one(mlp_artifact):
    run = kiln.load(mlp_artifact[1])
    in_place = {name: w._base is not None for name, w in run.weights.items()}  # (a view of the mapped file's bytes)
    layouts = json.loads((mlp_artifact[1] / "metadata.json").read_text())["weights"]
    assert in_place == {name: run.weights[name].is_contiguous() and w["stride"] == list(run.weights[name].stride())
                        for name, w in layouts.items()}
    assert any(in_place.values()) and not all(in_place.values())  # (the MLP's permuted weights are copies)


def test_a_weight_misaligned_in_the_file_is_copied(tmp_path):
    from kiln.deploy.load import _laid_out

    safetensors.save({"mask": torch.tensor([True, False, True]), "w": torch.arange(5.0)}, tmp_path / "w.safetensors")
    stored = safetensors.load(tmp_path / "w.safetensors")
    assert stored["w"].data_ptr() % 4 != 0  # (3 bytes after the mask)
    w = _laid_out(stored["w"], {"stride": [1]})
    assert w.data_ptr() % 4 == 0 and torch.equal(w, torch.arange(5.0))


def test_a_fresh_process_runs_the_artifact_without_compiling_or_a_compiler(mlp_artifact, tmp_path):
    model, path = mlp_artifact
    x = torch.randn(3, 16)
    safetensors.save({"x": x}, tmp_path / "x.safetensors")
    script = (
        "import shutil, sys, torch, kiln\n"
        "from kiln.deploy import safetensors\n"
        "assert shutil.which('g++') is None and shutil.which('c++') is None\n"
        "run = kiln.load(sys.argv[1])\n"
        "(y,) = run(safetensors.load(sys.argv[2])['x'])\n"
        "safetensors.save({'output_0': y}, sys.argv[3])\n"
    )
    cache, no_bin = tmp_path / "empty-cache", tmp_path / "no-bin"  # (no compiler on the PATH either)
    no_bin.mkdir()
    env = {**os.environ, "KILN_CACHE_DIR": str(cache), "KILN_RUNTIME_CACHE_DIR": str(cache / "runtime"), "PATH": str(no_bin)}
    subprocess.run([sys.executable, "-c", script, str(path), str(tmp_path / "x.safetensors"), str(tmp_path / "y.safetensors")],
                   env=env, check=True, timeout=300)
    with torch.no_grad():
        torch.testing.assert_close(safetensors.load(tmp_path / "y.safetensors")["output_0"], model(x), rtol=1e-4, atol=1e-4)
    assert not cache.exists() or not any(cache.rglob("*.so"))  # nothing was compiled


def test_inputs_of_the_wrong_shape_dtype_or_name_are_refused_with_the_signature(mlp_artifact):
    run = kiln.load(mlp_artifact[1])
    with pytest.raises(ValueError, match=r"input 'arg0' must be float32\[3, 16\], got torch.float32\[4, 16\]"):
        run(torch.randn(4, 16))
    with pytest.raises(ValueError, match=r"must be float32\[3, 16\], got torch.float64"):
        run(torch.randn(3, 16, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"unexpected or repeated input 'x'; the artifact takes arg0: float32\[3, 16\]"):
        run(x=torch.randn(3, 16))
    with pytest.raises(TypeError, match="missing input 'arg0'"):
        run()


def _copy(path, tmp_path):
    import shutil

    return Path(shutil.copytree(path, tmp_path / "copy"))


def test_a_corrupted_weights_file_is_named_and_not_loaded(mlp_artifact, tmp_path):
    copy = _copy(mlp_artifact[1], tmp_path)
    weights = copy / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="weights.safetensors does not match its digest"):
        kiln.load(copy)


def test_an_artifact_for_a_cpu_with_other_extensions_names_what_this_one_lacks(mlp_artifact, tmp_path):
    copy = _copy(mlp_artifact[1], tmp_path)
    metadata = json.loads((copy / "metadata.json").read_text())
    assert "avx2" in metadata["isa_flags"] or "asimd" in metadata["isa_flags"]
    metadata["isa"] = "0123456789abcdef"  # what -march=native resolves to may differ (caches, gcc): not refused
    (copy / "metadata.json").write_text(json.dumps(metadata))
    kiln.load(copy)
    metadata["isa_flags"] += ["kiln_test_extension"]
    metadata["cpu"] = "Some Future CPU"
    (copy / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(ArtifactError, match=r"built for the CPU instruction set of Some Future CPU .*this CPU \(.+\) "
                                            r"lacks kiln_test_extension: export the model again here"):
        kiln.load(copy)
    metadata["isa_flags"].pop()
    metadata["arch"] = "riscv64"
    (copy / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(ArtifactError, match="lacks the riscv64 architecture"):
        kiln.load(copy)


@pytest.mark.parametrize("key, value, said", [("isa", "0123456789abcdef", "CPU instruction set"),
                                              ("kiln_version", "0.0.1", "kiln version"),
                                              ("torch_version", "1.0.0", "torch version")])
def test_an_artifact_for_another_isa_or_version_says_so_naming_both(mlp_artifact, tmp_path, key, value, said):
    copy = _copy(mlp_artifact[1], tmp_path)
    metadata = json.loads((copy / "metadata.json").read_text())
    here = metadata[key]
    metadata[key] = value
    metadata.pop("isa_flags")  # (an artifact of an earlier kiln: the ISA is the -march=native digest)
    (copy / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(ArtifactError, match=f"built for {re.escape(said)}.* '{value}'.*this process has '{re.escape(here)}'"):
        kiln.load(copy)


def test_a_graph_break_is_an_error_naming_the_users_line(tmp_path):
    def with_break(x):
        y = x.sin()
        print("a side effect")  # breaks the graph
        return y * 2

    with pytest.raises(kiln.CaptureError, match="test_export.py"):
        kiln.export(with_break, (torch.randn(3),), path=tmp_path / "broken")


def test_bad_arguments_are_refused_naming_them(tmp_path):
    with pytest.raises(TypeError, match="args must be a tuple"):
        kiln.export(_mlp(), [torch.randn(3, 16)], path=tmp_path / "a")
    with pytest.raises(ValueError, match="dynamic_shapes names 'x', which is no input; the inputs are arg0"):
        kiln.export(_mlp(), (torch.randn(3, 16),), path=tmp_path / "a", dynamic_shapes={"x": {0: "batch"}})
    with pytest.raises(ValueError, match=r"names dimension 2; arg0 has 2 dimensions"):
        kiln.export(_mlp(), (torch.randn(3, 16),), path=tmp_path / "a", dynamic_shapes={"arg0": {2: "batch"}})
    with pytest.raises(TypeError, match="must be None or a dict"):
        kiln.export(_mlp(), (torch.randn(3, 16),), path=tmp_path / "a", dynamic_shapes=[{0: "batch"}])


def test_a_symbolic_batch_serves_every_size_in_its_range(tmp_path):
    from torch.export import Dim

    model = _mlp()
    x = torch.randn(3, 16)
    path = kiln.export(model, (x,), path=tmp_path / "mlp", dynamic_shapes={"arg0": {0: Dim("batch", min=2, max=64)}})
    metadata = json.loads((path / "metadata.json").read_text())
    assert metadata["inputs"][0]["shape"] == ["batch", 16] and metadata["symbols"] == {"batch": {"min": 2, "max": 64}}
    assert not hasattr(x, "_kiln_dynamic_dims")  # the export's marks do not stay on the caller's tensor
    run = kiln.load(path)
    for batch in (2, 5, 64):
        x = torch.randn(batch, 16)
        with torch.no_grad():
            torch.testing.assert_close(run(x)[0], model(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"must be float32\[batch, 16\], got torch.float32\[65, 16\]; the artifact "
                                         r"takes arg0: float32\[batch, 16\] \(batch in \[2, 64\]\)"):
        run(torch.randn(65, 16))


def _bert_inputs(batch, sequence, seed):
    g = torch.Generator().manual_seed(seed)
    ids, mask = torch.randint(0, 1000, (batch, sequence), generator=g), torch.ones(batch, sequence, dtype=torch.int64)
    mask[0, sequence // 2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module")
def dynamic_bert(tmp_path_factory):
    from torch.export import Dim

    model = _tiny_bert()
    batch, sequence = Dim("batch", max=16), Dim("seq", max=128)
    shapes = {"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: sequence}}
    path = kiln.export(model, (), _bert_inputs(2, 12, 0), path=tmp_path_factory.mktemp("art") / "bert",
                       dynamic_shapes=shapes)
    return model, path


def test_a_tiny_bert_with_symbolic_batch_and_sequence(dynamic_bert):
    model, path = dynamic_bert
    run = kiln.load(path)
    assert [i["shape"] for i in run.inputs] == [["batch", "seq"]] * 2
    for batch, sequence in ((2, 12), (3, 7), (5, 40)):
        inputs = _bert_inputs(batch, sequence, batch)
        with torch.no_grad():
            want = model(**inputs)
        torch.testing.assert_close(run(**inputs)[0], want.last_hidden_state, rtol=1e-4, atol=1e-4)
    inputs = _bert_inputs(3, 7, 0)
    inputs["attention_mask"] = inputs["attention_mask"][:, :6]  # the two must share the sequence length
    with pytest.raises(ValueError, match=r"input 'attention_mask' must be int64\[batch, seq\], got torch.int64\[3, 6\]"):
        run(**inputs)


def test_what_an_artifact_cannot_serve_is_refused_naming_it(tmp_path):
    from torch.export import Dim

    with pytest.raises(kiln.deploy.ExportError, match=r"serves seq only in \[2, 128\], narrower than dynamic_shapes "
                                                      r"declares \(\[2, inf\]\)"):
        kiln.export(_tiny_bert(), (), _bert_inputs(2, 12, 0), path=tmp_path / "a",
                    dynamic_shapes={"input_ids": {1: Dim("seq")}, "attention_mask": {1: Dim("seq")}})

    def reshapes_to_three(x):
        return x.reshape(3, -1).sin()  # needs exactly 3 rows

    with pytest.raises(kiln.deploy.ExportError, match="specializes dimension 0 of input 'arg0' to 3"):
        kiln.export(reshapes_to_three, (torch.randn(3, 4),), path=tmp_path / "b", dynamic_shapes={"arg0": {0: "rows"}})


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    from kiln.deploy.runner import build_runner

    return build_runner(tmp_path_factory.mktemp("runner"))


def _run_without_python(runner, artifact, inputs, tmp_path):
    """kiln-run in a process whose PATH holds no Python (nor anything else)."""
    safetensors.save(inputs, tmp_path / "in.safetensors")
    empty = tmp_path / "no-bin"
    empty.mkdir(exist_ok=True)
    done = subprocess.run([str(runner), str(artifact), str(tmp_path / "in.safetensors"), str(tmp_path / "out.safetensors")],
                          env={"PATH": str(empty)}, capture_output=True, text=True, timeout=300)
    return done, (safetensors.load(tmp_path / "out.safetensors") if done.returncode == 0 else None)


def test_kiln_run_runs_a_tiny_bert_and_a_tiny_resnet_without_python(runner, tmp_path):
    bert = _tiny_bert()
    g = torch.Generator().manual_seed(1)
    ids, mask = torch.randint(0, 1000, (2, 10), generator=g), torch.ones(2, 10, dtype=torch.int64)
    mask[0, 6:] = 0
    artifact = kiln.export(bert, (), {"input_ids": ids, "attention_mask": mask}, path=tmp_path / "bert")
    done, out = _run_without_python(runner, artifact, {"input_ids": ids, "attention_mask": mask}, tmp_path)
    assert done.returncode == 0, done.stderr
    with torch.no_grad():
        want = bert(input_ids=ids, attention_mask=mask)
    assert sorted(out) == ["output_0", "output_1"]
    torch.testing.assert_close(out["output_0"], want.last_hidden_state, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out["output_1"], want.pooler_output, rtol=1e-4, atol=1e-4)

    torch.manual_seed(0)
    resnet, x = TinyResNet().eval(), torch.randn(2, 3, 16, 16)
    artifact = kiln.export(resnet, (x,), path=tmp_path / "resnet")
    done, out = _run_without_python(runner, artifact, {"arg0": x}, tmp_path)
    assert done.returncode == 0, done.stderr
    with torch.no_grad():
        torch.testing.assert_close(out["output_0"], resnet(x), rtol=1e-4, atol=1e-4)


def test_kiln_run_serves_a_symbolic_artifact_at_other_sizes(runner, dynamic_bert, tmp_path):
    model, path = dynamic_bert
    inputs = _bert_inputs(3, 9, 7)
    done, out = _run_without_python(runner, path, inputs, tmp_path)
    assert done.returncode == 0, done.stderr
    with torch.no_grad():
        torch.testing.assert_close(out["output_0"], model(**inputs).last_hidden_state, rtol=1e-4, atol=1e-4)
    done, _ = _run_without_python(runner, path, _bert_inputs(17, 9, 7), tmp_path)
    assert done.returncode == 1 and "input 'input_ids' has the wrong dtype or shape; the artifact takes input_ids: " \
        "int64[batch, seq], attention_mask: int64[batch, seq] (batch in [2, 16], seq in [2, 128])" in done.stderr


def test_kiln_run_refuses_wrong_inputs_and_another_isa_naming_them(runner, mlp_artifact, tmp_path):
    done, _ = _run_without_python(runner, mlp_artifact[1], {"x": torch.randn(3, 16)}, tmp_path)
    assert done.returncode == 1 and "missing input 'arg0'; the artifact takes arg0: float32[3, 16]" in done.stderr
    copy = _copy(mlp_artifact[1], tmp_path)
    metadata = json.loads((copy / "metadata.json").read_text())
    metadata["isa"], metadata["isa_flags"] = "0123456789abcdef", metadata["isa_flags"] + ["kiln_test_extension"]
    (copy / "metadata.json").write_text(json.dumps(metadata))
    done, _ = _run_without_python(runner, copy, {"arg0": torch.randn(3, 16)}, tmp_path)
    assert done.returncode == 1 and "this CPU lacks kiln_test_extension" in done.stderr
    metadata["isa_flags"].pop()
    (copy / "metadata.json").write_text(json.dumps(metadata))
    done, _ = _run_without_python(runner, copy, {"arg0": torch.randn(3, 16)}, tmp_path)
    assert done.returncode == 0, done.stderr  # (another -march=native digest, the same extensions: it runs)
    del metadata["isa_flags"]  # an artifact of an earlier kiln: the digest decides
    (copy / "metadata.json").write_text(json.dumps(metadata))
    done, _ = _run_without_python(runner, copy, {"arg0": torch.randn(3, 16)}, tmp_path)
    assert done.returncode == 1 and "built for CPU instruction set '0123456789abcdef'" in done.stderr \
        and "this runner has '" in done.stderr


def test_kiln_run_refuses_a_corrupted_weights_file_by_its_digest(runner, mlp_artifact, tmp_path):
    # (every artifact kiln-run runs passes the same check: its SHA-256 agrees with hashlib's)
    copy = _copy(mlp_artifact[1], tmp_path)
    weights = copy / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # a weight's byte: the file's structure is intact
    weights.write_bytes(bytes(data))
    done, _ = _run_without_python(runner, copy, {"arg0": torch.randn(3, 16)}, tmp_path)
    assert done.returncode == 1 and "weights.safetensors does not match its digest in metadata.json" in done.stderr


def test_exporting_again_replaces_the_files_and_leaves_the_loaded_ones_alone(mlp_artifact, tmp_path):
    model, _ = mlp_artifact
    x = torch.randn(3, 16)
    path = kiln.export(model, (x,), path=tmp_path / "mlp")
    first = kiln.load(path)
    with open(path / "weights.safetensors", "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # as kiln-run maps it
    before = {p.name: p.stat().st_ino for p in path.iterdir()}
    kiln.export(model, (x,), path=path)
    assert sorted(p.name for p in path.iterdir()) == sorted(before)  # (no temporary file left)
    assert all(p.stat().st_ino != before[p.name] for p in path.iterdir())  # new files, the old ones intact
    assert mapped[:8] == (path / "weights.safetensors").read_bytes()[:8] and len(mapped) > 8
    with torch.no_grad():
        torch.testing.assert_close(first(x)[0], model(x), rtol=1e-5, atol=1e-5)


def test_kiln_run_reads_a_tensor_whose_bytes_follow_an_odd_length_one(runner, tmp_path):
    # safetensors packs tensors without gaps: `x` starts 3 bytes after the mask, misaligned for
    # float32 (kiln_artifact.h copies such a tensor rather than use the mapped bytes).
    def masked(mask, x):
        return torch.where(mask, x, 0.0) * 2

    mask, x = torch.tensor([True, False, True]), torch.randn(3)
    artifact = kiln.export(masked, (mask, x), path=tmp_path / "masked")
    done, out = _run_without_python(runner, artifact, {"arg0": mask, "arg1": x}, tmp_path)
    assert done.returncode == 0, done.stderr
    torch.testing.assert_close(out["output_0"], masked(mask, x))


def test_kilns_attention_runs_in_an_exported_model(tmp_path, monkeypatch, runner):
    # The exported library calls kiln::attention as its own copy of kiln's runtime defines it (no
    # Python in the artifact's calls), directly: in kiln-run, no dispatcher knows kiln::attention
    # (an exported runtime registers no operator).
    from kiln.autotune import attention
    from tests.codegen.test_kiln_attention import _SelfAttention

    asked = []
    monkeypatch.setattr(attention, "choose", lambda op, signature, candidates, *a, **k: asked.append(op) or "kiln")
    torch.manual_seed(0)
    model, x = _SelfAttention().eval(), torch.randn(1, 20, 128)
    artifact = kiln.export(model, (x,), path=tmp_path / "attention")
    run = kiln.load(artifact)
    (got,) = run(x)
    assert asked == ["attention"]
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)
    done, out = _run_without_python(runner, artifact, {"arg0": x}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert torch.equal(out["output_0"], got)
