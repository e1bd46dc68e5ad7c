"""The op table of the graph fuzzer: one function per kind of op, each proposing one statement.

An op function picks its operands through the Generator's helpers (generate.py), makes any
inputs it needs (index tensors in range, weights, a broadcasting partner) and returns the value
`g.try_stmt` kept, or None. Legality is finally decided by eager (try_stmt), so an op may propose
freely; what it must get right is what eager would accept *silently but wrongly*: index values in
range, no duplicate indices where the winner is unspecified, no float-only op's domain errors.
"""

from __future__ import annotations

import math

F = "torch.nn.functional"

# float -> float, with rounding
UNARY_FLOAT = [
    "torch.sin({x})", "torch.cos({x})", "torch.tanh({x})", "torch.sigmoid({x})", "torch.exp({x}.clamp(-8, 8))",
    "torch.log({x}.abs() + 1)", "torch.sqrt({x}.abs())", "torch.rsqrt({x}.abs() + 0.5)", F + ".gelu({x})",
    F + ".silu({x})", "torch.erf({x})", "{x} * {x}", "torch.reciprocal({x}.abs() + 1)", "torch.atan({x})",
    F + ".softplus({x})", "{x} * 0.5 + 1.25", F + ".gelu({x}, approximate='tanh')", "{x}.pow(3)",
    "torch.expm1({x}.clamp(-4, 4))", "torch.log1p({x}.abs())",
]
# float -> float, no rounding: the result of an exact value stays exact
UNARY_EXACT = [
    "torch.relu({x})", "{x}.abs()", "-{x}",
    "{x}.clamp(-0.5, 0.75)", "{x}.clamp(min=0.25)", F + ".hardtanh({x})",
    "{x}.contiguous()", "{x}.clone()",
]
# float -> float, exact but discontinuous: only on exact values (a rounding apart flips the result)
UNARY_STEP = ["torch.floor({x})", "torch.ceil({x})", "torch.round({x})", "torch.trunc({x})", "torch.sign({x})"]
UNARY_INT = ["{x}.abs()", "-{x}", "{x} * 3", "{x} + 1", "{x} // 2", "{x} % 3", "{x}.clamp(-2, 2)", "~{x}",
             "{x} << 1", "{x}.sign()"]
UNARY_BOOL = ["~{x}", "torch.logical_not({x})", "{x}.to(torch.int64)", "{x}.to(F32)", "{x}.to(BF16)"]
BINARY_ARITH = ["{x} + {y}", "{x} - {y}", "{x} * {y}", "{x}.add({y}, alpha=2)", "{x} / ({y}.abs() + 1)",
                "torch.lerp({x}, {y}, 0.25)", "torch.addcmul({x}, {x}, {y}, value=2)",
                "torch.hypot({x}, {y})"]
BINARY_EXACT = ["torch.maximum({x}, {y})", "torch.minimum({x}, {y})", "torch.clamp({x}, min={y})",
                "torch.clamp({x}, max={y})"]
BINARY_INT = ["torch.div({x}, {y}.abs() + 1, rounding_mode='floor')", "torch.remainder({x}, {y}.abs() + 1)",
              "{x} & {y}", "{x} | {y}", "{x} ^ {y}", "torch.div({x}, {y}.abs() + 1, rounding_mode='trunc')"]
COMPARE = ["{x} < {y}", "{x} <= {y}", "{x} == {y}", "{x} != {y}", "{x} > {y}", "{x} >= {y}",
           "torch.logical_and({x}, {y})", "torch.logical_or({x}, {y})", "torch.logical_xor({x}, {y})"]
SCALARS = ["2", "-1", "0.5", "1.5", "0", "True"]


def _fmt(template: str, **names) -> str:
    return template.format(**{k: v.name for k, v in names.items()})


def unary(g):
    x = g.pick()
    if x is None:
        return None
    if x.t.dtype.is_floating_point:
        table, exact = (UNARY_EXACT, True) if g.rng.random() < 0.4 else (UNARY_FLOAT, False)
        if x.exact and g.rng.random() < 0.15:
            table = UNARY_STEP
        if g.rng.random() < 0.1:
            table, exact = ["{x}.to(F32)", "{x}.to(BF16)"], True
    elif x.t.dtype.is_signed:
        table, exact = UNARY_INT + ["{x}.to(F32)", "{x}.to(BF16)", "{x}.to(torch.bool)"], True
    else:
        table, exact = UNARY_BOOL, True
    return g.try_stmt(_fmt(g.rng.choice(table), x=x), [x], exact)


def binary(g):
    x = g.pick()
    if x is None:
        return None
    if g.rng.random() < 0.15:  # a Python scalar operand
        expr = g.rng.choice(["{x} + S", "{x} * S", "{x} - S", "torch.maximum({x}, torch.tensor(S))", "{x} / S"])
        return g.try_stmt(_fmt(expr, x=x).replace("S", g.rng.choice(SCALARS)), [x], "maximum" in expr)
    y = g.partner(x)
    r = g.rng.random()
    if r < 0.5:
        return g.try_stmt(_fmt(g.rng.choice(BINARY_ARITH), x=x, y=y), [x, y], False)
    if r < 0.75:
        return g.try_stmt(_fmt(g.rng.choice(BINARY_EXACT), x=x, y=y), [x, y], True)
    if x.is_float or y.is_float:  # floor division and remainder are discontinuous: integers only
        return None
    return g.try_stmt(_fmt(g.rng.choice(BINARY_INT), x=x, y=y), [x, y], True)


def compare(g):
    x = g.exact_val()
    if x is None:
        return None
    y = g.partner(x)
    if not y.exact:
        return None
    return g.try_stmt(_fmt(g.rng.choice(COMPARE), x=x, y=y), [x, y], True)


def where(g):
    x = g.pick()
    if x is None:
        return None
    y = g.partner(x)
    c = g.pick(lambda v: v.t.dtype.is_floating_point is False and not v.t.dtype.is_signed
               and _broadcasts(v.shape, x.shape))
    if c is None or g.rng.random() < 0.3:
        c = g.new_input(g.partner_shape(x.shape), "bool")
    if g.rng.random() < 0.3:
        return g.try_stmt(f"torch.where({c.name}, {x.name}, {g.rng.choice(SCALARS[:4])})", [c, x], True)
    return g.try_stmt(f"torch.where({c.name}, {x.name}, {y.name})", [c, x, y], True)


def masked_fill(g):
    x = g.pick()
    if x is None:
        return None
    m = g.new_input(g.partner_shape(x.shape), "bool")
    value = {True: "1.5", False: "-3"}[x.t.is_floating_point()] if x.t.dtype != _bool() else "True"
    return g.try_stmt(f"{x.name}.masked_fill({m.name}, {value})", [x, m], True)


def cast(g):
    x = g.exact_val()
    if x is None:
        return None
    target = g.rng.choice(["F32", "BF16", "torch.int64", "torch.bool"])
    return g.try_stmt(f"{x.name}.to({target})", [x], True)


def reduction(g):
    x = g.pick()
    if x is None:
        return None
    dims, keep = g.dims(x), g.rng.random() < 0.3
    args = "" if dims is None else f"dim={dims!r}, keepdim={keep}"
    one = g.dim(x)
    r = g.rng.random()
    if r < 0.25:
        return g.try_stmt(f"{x.name}.sum({args})", [x], False)
    if r < 0.35 or 0.68 <= r < 0.97:  # float-only reductions (eager takes some on ints; its meta may not)
        if not x.is_float:
            return None
    if r < 0.35:
        return g.try_stmt(f"{x.name}.mean({args})", [x], False)
    if r < 0.5:
        return g.try_stmt(f"{x.name}.{g.rng.choice(['amax', 'amin'])}({args})", [x], True)
    if r < 0.6:
        if not x.exact:
            return None
        which = g.rng.choice(["argmax", "argmin"])
        dim_args = "" if g.rng.random() < 0.2 else f"dim={one}, keepdim={keep}"
        return g.try_stmt(f"{x.name}.{which}({dim_args})", [x], True)
    if r < 0.68:
        if not x.exact:
            return None
        return g.try_stmt(f"torch.max({x.name}, {one}, keepdim={keep})[{g.rng.randint(0, 1)}]", [x], True)
    if r < 0.76:
        return g.try_stmt(f"{x.name}.var({args}{', ' if args else ''}correction={g.rng.randint(0, 1)})", [x], False)
    if r < 0.86:
        fn = g.rng.choice(["torch.softmax", "torch.log_softmax"])
        return g.try_stmt(f"{fn}({x.name}, {one})", [x], False)
    if r < 0.93:
        return g.try_stmt(f"torch.cumsum({x.name}, {one})", [x], False)
    if r < 0.97:
        return g.try_stmt(f"torch.logsumexp({x.name}, {one}, keepdim={keep})", [x], False)
    if not x.exact:
        return None
    return g.try_stmt(f"{x.name}.{g.rng.choice(['any', 'all'])}({args})", [x], True)


# -- views -------------------------------------------------------------------------------------
def reshape(g):
    x = g.pick(lambda v: v.t.dim() > 0)
    if x is None:
        return None
    shape = list(x.shape)
    r = g.rng.random()
    if r < 0.3 and len(shape) >= 2:  # merge two neighbours
        i = g.rng.randrange(len(shape) - 1)
        shape[i:i + 2] = [shape[i] * shape[i + 1]]
    elif r < 0.6:  # split one dim
        i = g.rng.randrange(len(shape))
        divisors = [d for d in range(1, shape[i] + 1) if shape[i] and shape[i] % d == 0]
        if not divisors:
            return None
        d = g.rng.choice(divisors)
        shape[i:i + 1] = [d, shape[i] // d]
    elif r < 0.8:
        shape = [-1]
    else:
        shape.insert(g.rng.randint(0, len(shape)), 1)
    method = "view" if g.rng.random() < 0.25 else "reshape"
    return g.try_stmt(f"{x.name}.{method}({tuple(shape)!r})", [x], True)


def permute(g):
    x = g.pick(lambda v: v.t.dim() >= 2)
    if x is None:
        return None
    n = x.t.dim()
    r = g.rng.random()
    if r < 0.5:
        perm = list(range(n))
        g.rng.shuffle(perm)
        return g.try_stmt(f"{x.name}.permute{tuple(perm)!r}", [x], True)
    if r < 0.8:
        a, b = g.rng.sample(range(n), 2)
        return g.try_stmt(f"{x.name}.transpose({a}, {b})", [x], True)
    a, b = g.rng.sample(range(n), 2)
    return g.try_stmt(f"{x.name}.movedim({a}, {b})", [x], True)


def slicing(g):
    x = g.pick(lambda v: v.t.dim() > 0)
    if x is None:
        return None
    d = g.rng.randrange(x.t.dim())
    n = x.shape[d]
    r = g.rng.random()
    if r < 0.2 and n > 0:
        i = g.rng.randrange(-n, n)
        return g.try_stmt(f"{x.name}.select({d}, {i})", [x], True)
    if r < 0.3:
        return g.try_stmt(f"{x.name}.flip({d})", [x], True)
    if r < 0.4 and n > 0:
        return g.try_stmt(f"{x.name}.narrow({d}, {g.rng.randrange(n)}, 1)", [x], True)
    start = g.rng.choice(["", str(g.rng.randint(0, max(n, 1))), str(-g.rng.randint(1, max(n, 1)))])
    stop = g.rng.choice(["", str(g.rng.randint(0, max(n, 1))), str(-g.rng.randint(1, max(n, 1)))])
    step = g.rng.choice(["", "", ":2", ":3"])
    index = ", ".join([":"] * d + [f"{start}:{stop}{step}"])
    return g.try_stmt(f"{x.name}[{index}]", [x], True)


def expand(g):
    x = g.pick()
    if x is None:
        return None
    shape = [g.rng.randint(2, 4) if s == 1 and g.rng.random() < 0.7 else s for s in x.shape]
    if g.rng.random() < 0.3:
        shape.insert(0, g.rng.randint(1, 3))
    if g.rng.random() < 0.3 and shape:
        shape[-1] = -1
    return g.try_stmt(f"{x.name}.expand({tuple(shape)!r})", [x], True)


def squeeze(g):
    x = g.pick()
    if x is None:
        return None
    r = g.rng.random()
    if r < 0.4:
        return g.try_stmt(f"{x.name}.unsqueeze({g.rng.randint(-x.t.dim() - 1, x.t.dim())})", [x], True)
    if r < 0.7:
        ones = [i for i, s in enumerate(x.shape) if s == 1]
        arg = str(g.rng.choice(ones)) if ones and g.rng.random() < 0.7 else ""
        return g.try_stmt(f"{x.name}.squeeze({arg})", [x], True)
    if x.t.dim() < 2:
        return g.try_stmt(f"{x.name}.flatten()", [x], True)
    s = g.rng.randrange(x.t.dim() - 1)
    return g.try_stmt(f"{x.name}.flatten({s}, {g.rng.randint(s + 1, x.t.dim() - 1)})", [x], True)


def concat(g):
    x = g.pick(lambda v: v.t.dim() > 0)
    if x is None:
        return None
    d = g.dim(x)
    if g.rng.random() < 0.6:
        shape = list(x.shape)
        shape[d] = g.rng.choice([0, 1, 2, 3])
        same = g.pick(lambda v: v is not x and v.t.dim() == len(shape)
                      and all(a == b for i, (a, b) in enumerate(zip(v.shape, shape)) if i != d % len(shape)))
        y = same if same is not None and g.rng.random() < 0.5 else g.new_input(shape, _dtype_of(g, x))
        items = [x, y] if g.rng.random() < 0.7 else [y, x, y]
        return g.try_stmt(f"torch.cat([{', '.join(v.name for v in items)}], dim={d})", [x, y], True)
    y = g.pick(lambda v: v is not x and v.shape == x.shape) or g.new_input(x.shape, _dtype_of(g, x))
    return g.try_stmt(f"torch.stack([{x.name}, {y.name}], dim={g.rng.randint(-x.t.dim() - 1, x.t.dim())})",
                      [x, y], True)


def chunk(g):
    x = g.pick(lambda v: v.t.dim() > 0)
    if x is None:
        return None
    d = g.dim(x)
    k = g.rng.randint(2, 3)
    return g.try_stmt(f"{x.name}.chunk({k}, {d})[{g.rng.randint(-1, 0)}]", [x], True)


# -- indexing ----------------------------------------------------------------------------------
def index_select(g):
    x = g.pick(lambda v: v.t.dim() > 0)
    if x is None:
        return None
    d = g.dim(x)
    idx = g.index((g.rng.randint(0, 5),), x.shape[d])
    if x.shape[d] == 0 and idx.t.numel():
        return None
    return g.try_stmt(f"{x.name}.index_select({d}, {idx.name})", [x, idx], True)


def gather(g):
    x = g.pick(lambda v: v.t.dim() > 0 and v.t.numel() > 0)
    if x is None:
        return None
    d = g.dim(x)
    shape = [g.rng.randint(1, s) if s else 0 for s in x.shape]
    shape[d] = g.rng.randint(0, 4)
    idx = g.index(shape, x.shape[d])
    return g.try_stmt(f"torch.gather({x.name}, {d}, {idx.name})", [x, idx], True)


def advanced_index(g):
    x = g.pick(lambda v: v.t.dim() > 0 and v.t.numel() > 0)
    if x is None:
        return None
    r = g.rng.random()
    if r < 0.15:
        m = g.new_input(x.shape, "bool")
        # Its size depends on data: ops after it run on unbacked sizes, where torch's own fake
        # tensors give up on some (addcmul, log_softmax) and the frame runs eagerly (docs/limits.md).
        made = g.try_stmt(f"{x.name}[{m.name}]", [x, m], True)
        if made is not None:
            made.leaf = True
        return made
    if r < 0.5 or x.t.dim() < 2:
        idx = g.index(g.shape(g.rng.randint(1, 2)), x.shape[0], negative=True)
        return g.try_stmt(f"{x.name}[{idx.name}]", [x, idx], True)
    if r < 0.75:
        idx = g.index((g.rng.randint(1, 4),), x.shape[1], negative=True)
        return g.try_stmt(f"{x.name}[:, {idx.name}]", [x, idx], True)
    k = g.rng.randint(1, 4)
    i0 = g.index((k,), x.shape[0])
    i1 = g.index((g.rng.choice([1, k]),), x.shape[1])
    return g.try_stmt(f"{x.name}[{i0.name}, {i1.name}]", [x, i0, i1], True)


def index_put(g):
    x = g.pick(lambda v: v.t.dim() > 0 and v.t.numel() > 0)
    if x is None:
        return None
    r = g.rng.random()
    if r < 0.4:  # accumulate: duplicates allowed, they add up
        idx = g.index((g.rng.randint(1, 5),), x.shape[0])
        vals = g.new_input((idx.shape[0],) + x.shape[1:] if g.rng.random() < 0.7 else x.shape[-1:], _dtype_of(g, x))
        return g.try_stmt(f"{x.name}.index_put(({idx.name},), {vals.name}, accumulate=True)", [x, idx, vals], False)
    if r < 0.6:  # overwrite: distinct indices, so the result does not depend on write order
        k = g.rng.randint(1, x.shape[0])
        perm = g.rng.sample(range(x.shape[0]), k)
        vals = g.new_input((k,) + x.shape[1:], _dtype_of(g, x))
        return g.try_stmt(f"{x.name}.index_put((torch.tensor({perm!r}),), {vals.name})", [x, vals], True)
    if r < 0.8:
        d = g.dim(x)
        shape = [g.rng.randint(1, s) for s in x.shape]
        idx = g.index(shape, x.shape[d])
        src = g.new_input(shape, _dtype_of(g, x))
        return g.try_stmt(f"{x.name}.scatter_add({d}, {idx.name}, {src.name})", [x, idx, src], False)
    d = g.dim(x)
    idx = g.index((g.rng.randint(0, 4),), x.shape[d])
    shape = list(x.shape)
    shape[d] = idx.shape[0]
    src = g.new_input(shape, _dtype_of(g, x))
    return g.try_stmt(f"{x.name}.index_add({d}, {idx.name}, {src.name})", [x, idx, src], False)


# -- matmul and normalization ------------------------------------------------------------------
def matmul(g):
    a = g.pick(lambda v: v.is_float and 1 <= v.t.dim() <= 3)
    if a is None:
        return None
    dt = _dtype_of(g, a, floats_only=True)
    k = a.shape[-1]
    n = g.size()
    r = g.rng.random()
    if r < 0.4:
        shape = (k,) if g.rng.random() < 0.2 else (k, n)
        if a.t.dim() == 3 and g.rng.random() < 0.5:
            shape = (a.shape[0], k, n)
        b = g.new_input(shape, dt)
        return g.try_stmt(f"{a.name} @ {b.name}", [a, b], False)
    if r < 0.7:
        w = g.new_input((n, k), dt)
        bias = g.new_input((n,), dt) if g.rng.random() < 0.6 else None
        uses = [a, w] + ([bias] if bias else [])
        return g.try_stmt(f"{F}.linear({a.name}, {w.name}, {bias.name if bias else None})", uses, False)
    if r < 0.85 and a.t.dim() == 3:
        b = g.new_input((a.shape[0], k, n), dt)
        return g.try_stmt(f"torch.bmm({a.name}, {b.name})", [a, b], False)
    if a.t.dim() != 2:
        return None
    b = g.new_input((k, n), dt)
    c = g.new_input(g.partner_shape((a.shape[0], n)), dt)
    return g.try_stmt(f"torch.addmm({c.name}, {a.name}, {b.name}, beta=0.5)", [c, a, b], False)


def norm(g):
    x = g.pick(lambda v: v.is_float and v.t.dim() >= 1)
    if x is None:
        return None
    dt = _dtype_of(g, x, floats_only=True)
    r = g.rng.random()
    if r < 0.4:
        k = g.rng.randint(1, min(2, x.t.dim()))
        shape = x.shape[-k:]
        affine = g.rng.random() < 0.7
        w = g.new_input(shape, dt) if affine else None
        b = g.new_input(shape, dt) if affine else None
        args = f"{w.name}, {b.name}" if affine else "None, None"
        uses = [x] + ([w, b] if affine else [])
        if g.rng.random() < 0.2:
            return g.try_stmt(f"{F}.rms_norm({x.name}, {shape!r}, {w.name if affine else None})", uses[:2], False)
        return g.try_stmt(f"{F}.layer_norm({x.name}, {shape!r}, {args})", uses, False)
    if x.t.dim() < 2:
        return None
    c = x.shape[1]
    w, b = g.new_input((c,), dt), g.new_input((c,), dt)
    if r < 0.7:
        mean, var = g.new_input((c,), dt), g.new_input((c,), dt)
        return g.try_stmt(f"{F}.batch_norm({x.name}, {mean.name}, {var.name}.abs() + 0.5, {w.name}, {b.name}, "
                          f"False, 0.1, 1e-5)", [x, mean, var, w, b], False)
    groups = [d for d in range(1, c + 1) if c % d == 0]
    return g.try_stmt(f"{F}.group_norm({x.name}, {g.rng.choice(groups)}, {w.name}, {b.name})", [x, w, b], False)


def _bool():
    import torch
    return torch.bool


def _broadcasts(shape, target) -> bool:
    try:
        import torch
        return torch.broadcast_shapes(shape, target) == tuple(target)
    except RuntimeError:
        return False


def _dtype_of(g, v, floats_only: bool = False) -> str:
    from tests.fuzz.generate import dtype_name
    name = dtype_name(v.t)
    if floats_only and name not in ("float32", "bfloat16"):
        return "float32"
    return name


# (name, function, weight, family): the families the summary counts
OPS = [
    ("unary", unary, 10, "pointwise"), ("binary", binary, 12, "pointwise"), ("compare", compare, 4, "pointwise"),
    ("where", where, 3, "pointwise"), ("masked_fill", masked_fill, 2, "indexing"), ("cast", cast, 3, "pointwise"),
    ("reduction", reduction, 10, "reduction"), ("reshape", reshape, 4, "view"), ("permute", permute, 4, "view"),
    ("slice", slicing, 4, "view"), ("expand", expand, 2, "view"), ("squeeze", squeeze, 3, "view"),
    ("concat", concat, 3, "view"), ("chunk", chunk, 1, "view"), ("index_select", index_select, 2, "indexing"),
    ("gather", gather, 2, "indexing"), ("advanced_index", advanced_index, 3, "indexing"),
    ("index_put", index_put, 3, "indexing"), ("matmul", matmul, 4, "matmul"), ("norm", norm, 3, "normalization"),
]
assert all(math.isfinite(w) for _, _, w, _ in OPS)
