"""The min-cut partitioner: forward/backward graphs that match eager autograd, and save little."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.aot.partition import Partition, PartitionPolicy, partition
from kiln.aot.partition_cost import value_bytes

aten = torch.ops.aten


# --- building joint graphs -------------------------------------------------------------------


def make_joint(f, *primals, tracing_mode="fake"):
    """Trace ``f``'s joint forward+backward graph the way the AOT layer hands it over.

    Tensors in ``primals`` that require grad get a gradient; the joint returns
    ``(*f's outputs, one gradient or None per primal)``. Returns (joint, num_forward_outputs).
    """
    outs = f(*primals)
    diff = [i for i, o in enumerate(outs) if isinstance(o, torch.Tensor) and o.requires_grad]
    needs_grad = [i for i, p in enumerate(primals) if isinstance(p, torch.Tensor) and p.requires_grad]
    num_primals = len(primals)

    def joint(*args):
        ps, tangents = args[:num_primals], args[num_primals:]
        forward = f(*ps)
        grads = torch.autograd.grad(
            [forward[k] for k in diff], [ps[i] for i in needs_grad], list(tangents), allow_unused=True
        )
        per_primal = [None] * num_primals
        for i, g in zip(needs_grad, grads):
            per_primal[i] = g
        return (*forward, *per_primal)

    tangents = [torch.ones_like(outs[k]) for k in diff]
    decomps = core_aten_decompositions()
    with torch.enable_grad():
        traced = make_fx(joint, decomposition_table=decomps, tracing_mode=tracing_mode)(*primals, *tangents)
    # Autograd's formulas mutate (bernoulli_, div_): retrace the ATen graph functionalized.
    plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in (*primals, *tangents)]
    functional = make_fx(
        torch.func.functionalize(traced, remove="mutations"),
        decomposition_table=decomps,
        tracing_mode=tracing_mode,
    )(*plain)
    # (The schema's mutability, not torch.Tag.inplace, which torch 2.11 does not have.)
    assert not any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
                   for n in functional.graph.nodes)
    names = [f"primals_{i + 1}" for i in range(num_primals)]
    names += [f"tangents_{j + 1}" for j in range(len(tangents))]
    return _renamed(functional, names), len(outs)


def _renamed(gm, names):
    graph = fx.Graph()
    env = {}
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    assert len(placeholders) == len(names)
    for node, name in zip(placeholders, names):
        env[node] = graph.placeholder(name)
        env[node].meta = dict(node.meta)
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            env[node] = graph.node_copy(node, env.__getitem__)
    return fx.GraphModule(gm, graph)


def partition_both(joint, num_forward_outputs):
    """The min-cut partition and the plain save-everything one."""
    plain = PartitionPolicy(recompute=False)
    return partition(joint, num_forward_outputs), partition(joint, num_forward_outputs, policy=plain)


# --- running partitions against eager --------------------------------------------------------


def _detached(values):
    return [v.detach() if isinstance(v, torch.Tensor) else v for v in values]


def eager_reference(f, primals):
    """f's outputs, random tangents for its differentiable outputs, and one grad or None per primal."""
    ps = [p.detach().requires_grad_(p.requires_grad) if isinstance(p, torch.Tensor) else p for p in primals]
    outs = f(*ps)
    diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    tangents = [torch.randn_like(o) for o in diff]
    needs_grad = [i for i, p in enumerate(ps) if isinstance(p, torch.Tensor) and p.requires_grad]
    grads = torch.autograd.grad(diff, [ps[i] for i in needs_grad], tangents, allow_unused=True)
    per_primal = [None] * len(ps)
    for i, g in zip(needs_grad, grads):
        per_primal[i] = g
    return _detached(outs), tangents, per_primal


def run_partition(split: Partition, primals, tangents):
    """Forward on real inputs, then backward on what it saved: (outputs, gradients)."""
    out = split.forward(*_detached(primals))
    n = split.num_forward_outputs
    saved = out[n:]
    assert len(saved) == split.num_saved_tensors + split.num_saved_symints == len(split.saved)
    assert all(isinstance(t, torch.Tensor) for t in saved[: split.num_saved_tensors])
    assert not any(isinstance(s, torch.Tensor) for s in saved[split.num_saved_tensors :])
    grads = split.backward(*saved, *tangents)
    return list(out[:n]), list(grads)


def assert_matches_eager(split, f, primals):
    ref_outs, tangents, ref_grads = eager_reference(f, primals)
    outs, grads = run_partition(split, primals, tangents)
    torch.testing.assert_close(outs, ref_outs)
    assert len(grads) == len(ref_grads)
    for got, want in zip(grads, ref_grads):
        if want is None:
            assert got is None
        else:
            torch.testing.assert_close(got, want)


def check_graphs(split: Partition, joint: fx.GraphModule):
    """Structural invariants of both graphs."""
    primals = [n for n in joint.graph.find_nodes(op="placeholder") if n.name.startswith("primals")]
    tangents = [n for n in joint.graph.find_nodes(op="placeholder") if n.name.startswith("tangents")]
    fw_inputs = [n.name for n in split.forward.graph.find_nodes(op="placeholder")]
    bw_inputs = [n.name for n in split.backward.graph.find_nodes(op="placeholder")]
    assert fw_inputs == [n.name for n in primals]
    assert bw_inputs == split.saved + [n.name for n in tangents]
    for gm in (split.forward, split.backward):
        gm.graph.lint()
        for node in gm.graph.nodes:
            if node.op == "output":
                continue
            assert "val" in node.meta, node.name
            # dead code is gone: every computed value is used
            assert node.op == "placeholder" or node.users, node.name
    # nothing derived from a tangent leaks into the forward
    assert not any("tangents" in n.name for n in split.forward.graph.nodes)


def node_named(gm, name):
    return next(n for n in gm.graph.nodes if n.name == name)


# --- numerics --------------------------------------------------------------------------------


def _t(*shape, grad=True):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=grad)


CASES = {
    "gelu_linear": (lambda x, w, b: (F.gelu(x @ w + b),), lambda: (_t(4, 8), _t(8, 5), _t(5))),
    "layer_norm": (lambda x, g, b: (F.layer_norm(x, (6,), g, b),), lambda: (_t(3, 6), _t(6), _t(6))),
    "softmax": (lambda x: (torch.softmax(x, -1),), lambda: (_t(5, 7),)),
    "mlp_tanh": (
        lambda x, w1, b1, w2, b2: (torch.tanh(x @ w1 + b1) @ w2 + b2,),
        lambda: (_t(4, 6), _t(6, 8), _t(8), _t(8, 3), _t(3)),
    ),
    "output_without_grad": (lambda x: (x.sin() * 2, x.argmax(), x.detach().sum()), lambda: (_t(3, 4),)),
    "primal_without_grad": (
        # y never needs a gradient; unused requires grad but gets None from allow_unused
        lambda x, y, unused: ((x * y).exp(),),
        lambda: (_t(3, 4), _t(3, 4, grad=False), _t(2)),
    ),
    "tensor_used_twice": (lambda x: (x * x + x.sin() * x,), lambda: (_t(5, 3),)),
    "two_outputs": (lambda x, w: ((x @ w).relu(), x.cos().sum()), lambda: (_t(4, 3), _t(3, 2))),
}


@pytest.mark.parametrize("recompute", [True, False], ids=["mincut", "plain"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_eager(case, recompute):
    f, make_primals = CASES[case]
    primals = make_primals()
    joint, nf = make_joint(f, *primals)
    split = partition(joint, nf, policy=PartitionPolicy(recompute=recompute))
    check_graphs(split, joint)
    assert_matches_eager(split, f, primals)


def test_none_gradients_stay_in_place():
    f, make_primals = CASES["primal_without_grad"]
    joint, nf = make_joint(f, *make_primals())
    split = partition(joint, nf)
    grads = split.backward.graph.find_nodes(op="output")[0].args[0]
    assert len(grads) == 3
    assert grads[0] is not None and grads[1] is None and grads[2] is None


# --- what gets saved -------------------------------------------------------------------------


def test_pointwise_chain_saves_only_the_input():
    joint, nf = make_joint(lambda x: (x.sin().cos().sum(),), _t(16, 32))
    split, plain = partition_both(joint, nf)
    assert split.saved == ["primals_1"]
    assert split.saved_bytes == 16 * 32 * 8
    assert split.saved_bytes < plain.saved_bytes
    assert plain.recomputed == []
    assert len(split.recomputed) >= 3
    for name in split.recomputed:
        assert torch.Tag.pointwise in node_named(split.backward, name).target.tags
    assert_matches_eager(split, lambda x: (x.sin().cos().sum(),), [_t(16, 32)])


def test_plain_partition_saves_exactly_what_the_backward_reads():
    joint, nf = make_joint(lambda x: (x.sin().cos().sum(),), _t(4, 4))
    plain = partition(joint, nf, policy=PartitionPolicy(recompute=False))
    from_tangents = set()
    for node in joint.graph.nodes:
        if node.name.startswith("tangents") or any(i in from_tangents for i in node.all_input_nodes):
            from_tangents.add(node)
    live = set()
    stack = [n for n in joint.graph.find_nodes(op="output")[0].args[0][nf:] if isinstance(n, fx.Node)]
    while stack:
        node = stack.pop()
        if node not in live:
            live.add(node)
            stack.extend(node.all_input_nodes)
    reads = {i.name for n in live & from_tangents for i in n.all_input_nodes if i not in from_tangents}
    assert set(plain.saved) == reads


def test_matmul_is_saved_not_recomputed():
    # Recomputing x @ w would be cheaper in bytes (x and w are small, the product is large),
    # but matmuls are compute-bound: the cut must save its output (or what follows it).
    f = lambda x, w: ((x @ w).tanh(),)  # noqa: E731
    joint, nf = make_joint(f, _t(64, 2), _t(2, 64))
    split = partition(joint, nf)
    recomputed_targets = {node_named(split.backward, n).target for n in split.recomputed}
    assert not recomputed_targets & {aten.mm.default, aten.addmm.default, aten.bmm.default}
    assert split.saved_bytes >= 64 * 64 * 8
    assert_matches_eager(split, f, [_t(64, 2), _t(2, 64)])


def test_mlp_recomputes_no_matmul_and_saves_no_view():
    f, make_primals = CASES["mlp_tanh"]
    joint, nf = make_joint(f, *make_primals())
    split = partition(joint, nf)
    mms = {n.name for n in joint.graph.nodes if n.target in (aten.mm.default, aten.addmm.default)}
    assert mms and not mms & set(split.recomputed)
    # the weights' transposes cost as much to save as the weights: save the base, redo the view
    for name in split.saved:
        node = node_named(split.forward, name)
        assert node.op == "placeholder" or not node.target.is_view, name


def test_ties_keep_forward_work_out_of_the_backward():
    # exp's backward needs exp(x): saving x or exp(x) costs the same, but the forward computes
    # exp(x) anyway, so recomputing it would be wasted work.
    joint, nf = make_joint(lambda x: (x.exp(),), _t(8, 8))
    split = partition(joint, nf)
    assert split.saved == ["exp"]
    assert all(node_named(split.backward, n).target.is_view for n in split.recomputed)  # aliases only


def test_backward_only_chain_stays_out_of_the_forward():
    # GELU's derivative is needed only by the backward: save the pre-activation and let the
    # backward compute the derivative, rather than computing it in the forward and saving it.
    f, make_primals = CASES["gelu_linear"]
    joint, nf = make_joint(f, *make_primals())
    split = partition(joint, nf)
    assert "add" in split.saved
    assert not any(n.target == aten.exp.default for n in split.forward.graph.nodes)
    assert any(node_named(split.backward, n).target == aten.exp.default for n in split.recomputed)


def test_values_made_from_constants_are_recomputed_not_saved():
    f = lambda x: (x * torch.arange(4, dtype=torch.float64),)  # noqa: E731
    joint, nf = make_joint(f, _t(3, 4))
    split = partition(joint, nf)
    assert split.saved == [] and split.saved_bytes == 0
    assert [node_named(split.backward, n).target for n in split.recomputed] == [aten.arange.start_step]
    assert_matches_eager(split, f, [_t(3, 4)])


def test_never_recompute_policy_pins_an_op():
    joint, nf = make_joint(lambda x: (x.sin().cos().sum(),), _t(4, 4))
    split = partition(joint, nf, policy=PartitionPolicy(never_recompute={aten.sin}))
    sins = {n.name for n in joint.graph.nodes if n.target == aten.sin.default}
    assert not sins & set(split.recomputed)
    assert split.saved != ["primals_1"]


def test_reductions_policy():
    f, make_primals = CASES["layer_norm"]
    primals = make_primals()
    joint, nf = make_joint(f, *primals)
    split = partition(joint, nf, policy=PartitionPolicy(recompute_reductions=False))
    for name in split.recomputed:
        assert torch.Tag.reduction not in node_named(split.backward, name).target.tags
    assert_matches_eager(split, f, primals)


def _sin_chain(x, n=24):
    for _ in range(n):
        x = x.sin()
    return (x.sum(),)


def _longest_recomputed_chain(split):
    depth = {}
    for node in split.backward.graph.nodes:
        if node.name in split.recomputed:
            step = 1 if isinstance(node.target, torch._ops.OpOverload) and not node.target.is_view else 0
            depth[node] = max((depth.get(i, 0) for i in node.all_input_nodes), default=0) + step
    return max(depth.values(), default=0)


def test_recompute_depth_is_bounded():
    joint, nf = make_joint(_sin_chain, _t(8, 8))
    unbounded = partition(joint, nf, policy=PartitionPolicy(max_recompute_depth=None))
    bounded = partition(joint, nf, policy=PartitionPolicy(max_recompute_depth=4))
    assert unbounded.saved == ["primals_1"]
    assert _longest_recomputed_chain(unbounded) > 4
    assert _longest_recomputed_chain(bounded) <= 4
    assert bounded.saved_bytes > unbounded.saved_bytes
    assert_matches_eager(bounded, _sin_chain, [_t(8, 8)])


# --- random ops ------------------------------------------------------------------------------


@pytest.mark.parametrize("tracing_mode", ["fake", "symbolic"])
def test_dropout_mask_is_saved_not_redrawn(tracing_mode):
    # x is narrow and broadcast, so re-drawing the mask from x would save fewer bytes than
    # saving the mask: only the ban on recomputing random ops keeps the mask saved.
    f = lambda x: (F.dropout(x.expand(-1, 32), 0.5, training=True) * 1,)  # noqa: E731
    x = torch.randn(64, 1, requires_grad=True)
    joint, nf = make_joint(f, x, tracing_mode=tracing_mode)
    split = partition(joint, nf)
    check_graphs(split, joint)
    for name in split.recomputed:
        target = node_named(split.backward, name).target
        assert torch.Tag.nondeterministic_seeded not in getattr(target, "tags", ())
    for seed in (0, 1):
        torch.manual_seed(seed)
        (y,), (grad,) = run_partition(split, [x], [torch.ones(64, 32)])
        kept = y != 0
        assert 0 < kept.sum() < kept.numel()
        # d(sum y)/dx: each kept element contributes the 1 / (1 - p) = 2 scale
        torch.testing.assert_close(grad, (kept.double() * 2).sum(1, keepdim=True).float(), rtol=0, atol=0)


# --- symbolic shapes -------------------------------------------------------------------------


def test_symbolic_shapes_run_at_two_sizes():
    f = lambda x, w, b, n: (F.gelu(x @ w + b).view(-1).sum() * n,)  # noqa: E731
    joint, nf = make_joint(f, _t(4, 8), _t(8, 5), _t(5), 3, tracing_mode="symbolic")
    assert any(isinstance(n.meta["val"], torch.SymInt) for n in joint.graph.nodes)
    for policy in (PartitionPolicy(), PartitionPolicy(recompute=False)):
        split = partition(joint, nf, policy=policy)
        check_graphs(split, joint)
        assert split.num_saved_symints >= 1
        assert "primals_4" in split.saved  # the SymInt n, used by the backward
        assert split.saved.index("primals_4") >= split.num_saved_tensors
        for shapes, n in (([(4, 8), (8, 5), (5,)], 3), ([(6, 3), (3, 7), (7,)], 5)):
            primals = [_t(*s) for s in shapes] + [n]
            assert_matches_eager(split, f, primals)


# --- accounting and reporting ----------------------------------------------------------------


@pytest.mark.parametrize("case", ["gelu_linear", "layer_norm", "mlp_tanh", "output_without_grad"])
def test_saved_bytes_accounting(case):
    f, make_primals = CASES[case]
    primals = make_primals()
    joint, nf = make_joint(f, *primals)
    for split in partition_both(joint, nf):
        placeholders = split.backward.graph.find_nodes(op="placeholder")
        metas = [n.meta["val"] for n in placeholders][: split.num_saved_tensors]
        assert split.saved_bytes == sum(m.numel() * m.element_size() for m in metas)
        assert split.saved_bytes == sum(value_bytes(m) for m in metas)
        out = split.forward(*_detached(primals))
        real = out[nf : nf + split.num_saved_tensors]
        assert split.saved_bytes == sum(t.numel() * t.element_size() for t in real)


def test_symints_with_the_same_value_are_saved_once():
    # x and y share their size symbols, and the backward needs only their sizes (to expand).
    f = lambda x, y: ((x.sum(1) * y.sum(1)).sin(),)  # noqa: E731
    joint, nf = make_joint(f, _t(4, 6), _t(4, 6), tracing_mode="symbolic")
    split = partition(joint, nf)
    placeholders = split.backward.graph.find_nodes(op="placeholder")
    symints = [str(n.meta["val"]) for n in placeholders[split.num_saved_tensors : len(split.saved)]]
    assert len(symints) == 2 and len(set(symints)) == 2
    assert_matches_eager(split, f, [_t(3, 5), _t(3, 5)])


def test_symbolic_saved_bytes_use_hints():
    f = lambda x: (x.exp().sum(),)  # noqa: E731
    joint, nf = make_joint(f, _t(6, 10), tracing_mode="symbolic")
    split = partition(joint, nf)
    assert split.saved_bytes == 6 * 10 * 8


def test_summary_names_saved_and_recomputed():
    f, make_primals = CASES["gelu_linear"]
    joint, nf = make_joint(f, *make_primals())
    split = partition(joint, nf)
    text = split.summary()
    assert split.saved and split.recomputed
    for name in split.saved + split.recomputed:
        assert name in text
    assert str(split.saved_bytes) in text
    assert "float64[4, 8]" in text
    assert "aten.gelu" not in text or "gelu" in split.recomputed


def test_argument_errors():
    joint, nf = make_joint(lambda x: (x.sin(),), _t(3))
    with pytest.raises(ValueError, match="num_forward_outputs"):
        partition(joint, 5)
    with pytest.raises(TypeError, match="policy"):
        partition(joint, nf, policy={"recompute": False})
    with pytest.raises(TypeError, match="GraphModule"):
        partition(joint.graph, nf)
    with pytest.raises(ValueError, match="max_recompute_depth"):
        PartitionPolicy(max_recompute_depth=-1)
    with pytest.raises(ValueError, match="depends on a tangent"):
        partition(joint, 2)  # claims the gradient is a forward output
