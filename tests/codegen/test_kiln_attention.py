"""kiln's attention (kiln/native/include/kiln_attention.h): against a float64 softmax(q kᵀ s + m) v
on ragged shapes (sequence lengths and head sizes off the vector width and the register tiles),
causal and not, masks of every broadcast shape, fully masked and NaN rows, strided operands and
the row splits of few heads; ATen's output layout; other x86 ISAs; given to graphs by the
kiln_attention pass where the autotuner picks it, through both wrappers, and never in a
training graph (which reads the log-sum-exp)."""

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.autotune import attention as attention_autotune
from kiln.externs import kiln_attention
from tests.codegen.test_kiln_gemm import x86_kernels_built_with
from tests.kiln_backend import compiled_graphs
from tests.kiln_backend import kiln_wherever_offered, private_cache  # noqa: F401  (fixtures)

aten = torch.ops.aten
INF = float("inf")


def _reference(q, k, v, mask, scale, causal):
    scores = (q.double() @ k.double().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask.double()
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), -INF)
    top = scores.amax(-1, keepdim=True)
    top = torch.where(top == -INF, 0.0, top)  # a fully masked row: zeros, as ATen's CPU kernel gives
    e = (scores - top).exp()
    return (e / e.sum(-1, keepdim=True).clamp_min(1e-300) @ v.double()).float()


def _operands(b, h, sq, sk, d, dv, seed, transposed=True):
    torch.manual_seed(seed)
    if transposed:  # [B, S, H, D] storage seen as [B, H, S, D], as a model's heads are
        q = torch.randn(b, sq, h, d).transpose(1, 2)
        k = torch.randn(b, sk, h, d).transpose(1, 2)
        v = torch.randn(b, sk, h, dv).transpose(1, 2)
        return q, k, v
    return torch.randn(b, h, sq, d), torch.randn(b, h, sk, d), torch.randn(b, h, sk, dv)


L = kiln_attention.lanes()
# (batch, heads, queries, keys, head size, v's head size)
SHAPES = [(1, 12, 128, 128, 64, 64), (1, 12, 197, 197, 64, 64), (2, 3, 7, 9, 5, L), (1, 2, 33, 33, 17, 2 * L),
          (3, 1, 1, 50, 64, 64), (1, 1, 257, 300, 80, 3 * L), (2, 2, 60, 60, 64, 64), (1, 1, 100, 61, 64, 5 * L),
          # few query rows (a decode step's): keys read where they lie, not packed
          (1, 12, 1, 159, 64, 64), (2, 3, 4, 37, 17, 2 * L), (1, 2, 2, 5, 64, L), (1, 4, 3, 300, 80, 5 * L),
          # a grouped-query decode step (Qwen2-0.5B's: 2 key-value heads of 7 query rows): a head a thread at 2
          (1, 2, 7, 159, 64, 64)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_kiln_attention_matches_a_float64_softmax(shape, causal):
    b, h, sq, sk, d, dv = shape
    q, k, v = _operands(*shape, seed=sq + sk)
    for mask_shape in (None, (b, 1, 1, sk), (1, h, sq, sk), (b, h, sq, sk), (1, 1, sq, 1)):
        mask = torch.randn(mask_shape) if mask_shape is not None else None
        out = kiln_attention.attention(q, k, v, mask, 0.3, causal)
        torch.testing.assert_close(out, _reference(q, k, v, mask, 0.3, causal), rtol=2e-5, atol=2e-5)


def test_masks_of_any_layout():
    """The operator reads the mask by its own strides (zero where it broadcasts): a transposed mask
    (its rows not of unit stride: copied), a slice of a wider one (an offset, a row stride off the
    keys), a key-padding mask over one key, and a mask of one key column broadcast along the keys."""
    b, h, sq, sk = 2, 3, 5, 7
    q, k, v = _operands(b, h, sq, sk, 16, L, seed=4)
    wide = torch.randn(b, h, sq, sk + 6)
    for mask in (torch.randn(b, h, sk, sq).transpose(-1, -2), wide[..., 3:3 + sk], wide[:1, :, :, 2:3],
                 torch.randn(b, 1, 1, sk)[..., ::1]):
        out = kiln_attention.attention(q, k, v, mask, 0.3, False)
        torch.testing.assert_close(out, _reference(q, k, v, mask, 0.3, False), rtol=2e-5, atol=2e-5)
    q1, k1, v1 = _operands(b, h, sq, 1, 16, L, seed=5)  # one key: a row of one element
    mask = torch.randn(b, h, 1, sq).transpose(-1, -2)
    torch.testing.assert_close(kiln_attention.attention(q1, k1, v1, mask, 0.3, False),
                               _reference(q1, k1, v1, mask, 0.3, False), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("shape", SHAPES[:4], ids=lambda s: "x".join(map(str, s)))
def test_keys_after_a_rows_last_unmasked_one_are_skipped_alike(shape):
    # Masks of 0 and -inf (GPT-2's causal mask written out, padding, rows masked after a random key
    # or wholly) and with other values before the -inf, and of the most negative float: the kernel
    # skips each row's keys after its last one not masked, and adds no mask that is zero before
    # every row's end.
    b, h, sq, sk, d, dv = shape
    q, k, v = _operands(*shape, seed=sq * sk)
    causal = torch.where(torch.ones(sq, sk, dtype=torch.bool).tril(), 0.0, -INF)
    for mask_shape in ((1, 1, sq, sk), (b, 1, sq, sk), (1, h, sq, sk), (b, h, sq, sk), (b, 1, 1, sk)):
        ends = torch.randint(0, sk + 1, mask_shape[:3] + (1,))
        trailing = torch.where(torch.arange(sk) < ends, 0.0, -INF)
        written_causal = [causal.expand(mask_shape).contiguous()] if mask_shape[2] == sq else []
        # HuggingFace's masks of the most negative float (T5's causal one over its position bias,
        # BERT's padding): cut where the row keeps an ordinary key, a row of only them even.
        lowest = torch.where(torch.arange(sk) < ends, torch.randn(mask_shape), torch.finfo(torch.float32).min)
        for mask in (trailing, trailing + torch.randn(mask_shape), *written_causal, lowest):
            out = kiln_attention.attention(q, k, v, mask, 0.3)
            torch.testing.assert_close(out, _reference(q, k, v, mask, 0.3, False), rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(kiln_attention.attention(q, k, v, causal.expand(1, 1, sq, sk), 0.3),
                               kiln_attention.attention(q, k, v, None, 0.3, sq <= sk), rtol=0, atol=0)


def test_the_output_is_laid_out_as_atens():
    q, k, v = _operands(2, 4, 9, 9, 64, 64, seed=0, transposed=False)
    out = kiln_attention.attention(q, k, v)
    want = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[0]
    assert out.stride() == want.stride()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)  # the default scale is 1 / sqrt(head size)


def test_masked_rows_are_zero_and_nan_rows_nan():
    q, k, v = _operands(1, 2, 20, 20, 64, 64, seed=1)
    mask = torch.zeros(1, 1, 20, 20)
    mask[..., 3, :] = -INF  # every key masked: zeros
    mask[..., 5, 2:] = -INF  # all but two
    q = q.clone()
    q[0, 1, 7] = float("nan")  # a row of NaN scores
    out = kiln_attention.attention(q, k, v, mask, 0.125)
    assert (out[:, :, 3] == 0).all()
    assert out[0, 1, 7].isnan().all() and not out[0, 0, 7].isnan().any()
    want = _reference(q, k, v, mask, 0.125, False)
    keep = torch.ones(20, dtype=torch.bool)
    keep[7] = False
    torch.testing.assert_close(out[0, 0], want[0, 0], rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(out[0, 1, keep], want[0, 1, keep], rtol=2e-5, atol=2e-5)


def test_few_rows_masked_whole_or_nan():
    # The few-rows path (at most four query rows a head): a row with every key masked is zeros,
    # one of NaN scores NaN, the others exact.
    q, k, v = _operands(1, 2, 3, 45, 64, 64, seed=3)
    mask = torch.zeros(1, 1, 3, 45)
    mask[..., 0, :] = -INF
    mask[..., 2, 30:] = -INF
    q = q.clone()
    q[0, 1, 1] = float("nan")
    out = kiln_attention.attention(q, k, v, mask, 0.125)
    assert (out[:, :, 0] == 0).all()
    assert out[0, 1, 1].isnan().all() and not out[0, 0, 1].isnan().any()
    want = _reference(q, k, v, mask, 0.125, False)
    torch.testing.assert_close(out[0, 0], want[0, 0], rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(out[0, 1, 2], want[0, 1, 2], rtol=2e-5, atol=2e-5)


def test_what_the_kernel_takes():
    q, k, v = _operands(1, 2, 8, 8, 64, 64, seed=2)
    assert kiln_attention.applies(q, k, v, None)
    assert kiln_attention.applies(q, k, v, torch.zeros(1, 1, 1, 8))
    assert not kiln_attention.applies(q, k, v, torch.zeros(1, 1, 8, 8, dtype=torch.bool))
    assert not kiln_attention.applies(q.bfloat16(), k.bfloat16(), v.bfloat16(), None)
    assert not kiln_attention.applies(q, k, v[..., :L + 1], None)  # v's head size off the vector width
    assert not kiln_attention.applies(q, k[:, :1], v[:, :1], None)  # fewer heads of keys (grouped queries)
    with pytest.raises(RuntimeError, match="kiln::attention"):
        kiln_attention.attention(q, k, v[..., :L + 1])


def _symbolic_keys(room: int, length: int):
    """Fake q [1, 2, 1, 64], keys/values [1, 2, s1, 64] viewing a cache of s0 rows (a growing
    cache's step), a mask [1, 1, 1, s1] — the sizes symbolic, the examples `room` and `length` —
    and values [1, 2, length, 64] of static size."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.STATIC, DimDynamic.STATIC, DimDynamic.DYNAMIC,
                                                      DimDynamic.STATIC])
    mode = FakeTensorMode(shape_env=ShapeEnv(), static_shapes=False)
    rooms = mode.from_tensor(torch.empty(1, 2, room, 64), symbolic_context=dynamic)
    lengths = mode.from_tensor(torch.empty(1, 1, 1, length), symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.STATIC] * 3 + [DimDynamic.DYNAMIC]))
    with mode:
        keys = rooms[:, :, :lengths.shape[-1]]
    static = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.STATIC] * 4)
    return (mode.from_tensor(torch.empty(1, 2, 1, 64), symbolic_context=static), keys, lengths,
            mode.from_tensor(torch.empty(1, 2, length, 64), symbolic_context=static))


def test_symbolic_lengths_are_taken_and_timed_at_their_size_bucket():
    """A decode step's keys of symbolic length (one graph for every length): the kernel applies by
    the sizes' expressions (no guard; where ATen's kernel requires two sizes equal, a symbolic one is
    taken as the call will find it), and the autotuner times it with each size at the next power
    of two of its example, strides too (the cache's room of 300 rows -> 512, the length 129 -> 256)."""
    q, keys, mask, static_values = _symbolic_keys(room=300, length=129)
    env = keys.shape[2].node.shape_env
    guards = len(env.guards)
    assert kiln_attention.applies(q, keys, keys, mask)
    # Values whose length is another size: ATen's kernel too fails any call where they differ.
    assert kiln_attention.applies(q, keys, static_values, mask)
    # Fewer key heads than query heads, which ATen's kernel takes and kiln's does not.
    assert not kiln_attention.applies(q, keys[:, :1], keys[:, :1], mask)
    timed_q, timed_k, timed_v, timed_mask = attention_autotune.timing_values(q, keys, keys, mask)
    assert len(env.guards) == guards  # nothing was guarded on
    assert tuple(timed_k.shape) == (1, 2, 256, 64) and tuple(timed_k.stride()) == (2 * 512 * 64, 512 * 64, 64, 1)
    assert tuple(timed_mask.shape) == (1, 1, 1, 256) and tuple(timed_q.shape) == (1, 2, 1, 64)


def _kernel_entry(lib, q, k, v, mask, scale, causal):
    """The kernel's C entry (kiln_attention_f32 of kernels_unit.source(), which kiln::attention calls)
    in `lib`, on contiguous q, k, v and a mask of full size: no preparation to repeat here."""
    b, h, sq, d = q.shape
    sk, dv = k.shape[2], v.shape[3]
    q, k, v, mask = (t.contiguous() for t in (q, k, v, mask.expand(b, h, sq, sk)))
    out = torch.empty(b, h, sq, dv)
    shape = (ctypes.c_int64 * 21)(b, h, sq, sk, d, dv, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                                  *out.stride()[:3], *mask.stride()[:3])
    lib.kiln_attention_f32.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_float, ctypes.c_int32]
    lib.kiln_attention_f32(shape, q.data_ptr(), k.data_ptr(), v.data_ptr(), mask.data_ptr(), out.data_ptr(), scale,
                           int(causal))
    return out


@pytest.mark.parametrize("flags", [["-march=x86-64-v3"], ["-march=x86-64-v2"]], ids=["avx2", "sse4"])
def test_other_isas(flags, tmp_path):
    """The tiles of narrower ISAs (AVX2: 6 x 2 score tiles of 8 lanes), built with their flags."""
    lib = x86_kernels_built_with(flags, tmp_path)
    for shape in [(1, 3, 37, 41, 20, 32), (2, 1, 9, 9, 64, 64), (1, 4, 1, 45, 20, 32), (2, 2, 3, 19, 64, 64)]:
        b, h, sq, sk, d, dv = shape
        q, k, v = _operands(*shape, seed=sq)
        mask = torch.randn(b, 1, sq, sk)
        for causal in (False, True):
            out = _kernel_entry(lib, q, k, v, mask, 0.2, causal)
            torch.testing.assert_close(out, _reference(q, k, v, mask, 0.2, causal), rtol=2e-5, atol=2e-5)


class _SelfAttention(torch.nn.Module):
    def __init__(self, width=128, heads=2, causal=False):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv, self.out = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)

    def forward(self, x, mask=None):
        b, s, w = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(b, s, w))


def _attention_impls(graphs) -> list[str]:
    return [str(step.op) for g in graphs for step in g.schedule.externs if "attention" in str(step.op)]


@pytest.mark.parametrize("cpp_wrapper", [True, False], ids=["cpp-wrapper", "python-wrapper"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_model_runs_kilns_attention(kiln_wherever_offered, cpp_wrapper, causal):
    torch.manual_seed(0)
    model, x = _SelfAttention(causal=causal).eval(), torch.randn(1, 40, 128)
    mask = None if causal else torch.randn(1, 1, 1, 40)
    graphs = compiled_graphs(model, x, mask, cpp_wrapper=cpp_wrapper)
    assert _attention_impls(graphs) == ["kiln.attention.default"]


class _WrittenOut(torch.nn.Module):
    """Attention in eager ops with an additive bias, as T5 writes it: the attention pass makes it
    ATen's flash call, then kiln_attention kiln's."""

    def forward(self, q, k, v, bias):
        return torch.softmax(q @ k.transpose(-1, -2) + bias, dim=-1) @ v


def test_attention_written_out_runs_kilns_kernel(kiln_wherever_offered):
    q, k, v = _operands(1, 4, 30, 30, 64, 64, seed=3)
    graphs = compiled_graphs(_WrittenOut(), q, k, v, torch.randn(1, 4, 30, 30))
    assert _attention_impls(graphs) == ["kiln.attention.default"]


def test_the_autotuner_keeps_atens_where_it_is_faster(monkeypatch):
    offered = []

    def pick_aten(op, signature, candidates, *a, **k):
        offered.append(sorted(candidates))
        return "aten"

    monkeypatch.setattr(attention_autotune, "choose", pick_aten)
    torch.manual_seed(0)
    graphs = compiled_graphs(_SelfAttention().eval(), torch.randn(1, 40, 128))
    assert offered == [["aten", "kiln"]]
    assert _attention_impls(graphs) == ["aten._scaled_dot_product_flash_attention_for_cpu.default"]


def test_a_training_graph_keeps_atens_kernel(kiln_wherever_offered):
    # The forward saves the log-sum-exp for the backward: ATen's kernel, whose backward reads it.
    torch.manual_seed(0)
    model, x = _SelfAttention(), torch.randn(1, 24, 128, requires_grad=True)
    compiled = kiln.compile(model)
    compiled(x).sum().backward()
    got = x.grad.clone()
    x.grad = None
    model(x).sum().backward()
    torch.testing.assert_close(got, x.grad, rtol=1e-4, atol=1e-4)


# A process that compiles _SelfAttention with kiln's attention, the AOT cache in argv[1]: prints
# how many graphs it built (0: all read from the cache).
_FRESH = """
import sys, torch, kiln
from kiln.autotune import attention, gemm
from tests.codegen.test_kiln_attention import _SelfAttention
attention.choose = lambda op, signature, candidates, *a, **k: "kiln"
gemm.choose = lambda op, signature, candidates, *a, **k: next(iter(candidates))  # nothing timed
torch.manual_seed(0)
model, x = _SelfAttention().eval(), torch.randn(1, 40, 128)
with kiln.config.patch({"cache.dir": sys.argv[1], "backend.cpp_wrapper": False}), torch.no_grad(), \\
        kiln.backend.watch() as built:
    torch.testing.assert_close(kiln.compile(model)(x), model(x), rtol=1e-4, atol=1e-4)
print(len(built))
"""


def test_a_cached_graph_calling_kilns_attention_loads_in_a_fresh_process(tmp_path):
    # kiln::attention is defined when kiln's runtime is loaded: a frozen graph that calls it, read
    # from the AOT cache by a process that has not loaded the runtime, loads it first (a cache
    # hit, not a graph that fails to unpickle and is built again).
    root = Path(__file__).parents[2]
    built = [subprocess.run([sys.executable, "-c", _FRESH, str(tmp_path)], cwd=root, capture_output=True, text=True,
                            check=True, timeout=600).stdout.split()[-1] for _ in range(2)]
    assert built == ["1", "0"]


@pytest.mark.parametrize("rows", [20, 7])
def test_the_bits_do_not_depend_on_the_thread_count(rows):
    # Rows are split among threads into tasks; the path a row takes (few rows, or packed keys)
    # depends on the attention's query count only, so an exported model run with another thread
    # count gives the same bits (2 heads x 20 rows on 2 threads made a task of 4 rows; 2 heads of
    # 7 rows are a head a task at 1 and 2 threads, split in two at 3).
    q, k, v = _operands(1, 2, rows, 50, 64, 64, seed=4)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(kiln_attention.attention(q, k, v, None, 0.125))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
