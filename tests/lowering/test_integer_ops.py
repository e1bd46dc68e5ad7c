"""Integer ops bit-exact with eager: bitwise ops, shifts past the bit width, division rounding of
negative operands, and which integer divisions stay extern (a tensor divisor may be zero)."""

import pytest
import torch

from tests.lowering.support import check, extern_ops, through

aten = torch.ops.aten


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
def test_bitwise_ops_and_shifts(dtype):
    info = torch.iinfo(dtype)
    a = torch.tensor([0, 1, 5, 100, info.max, info.min, 7, 3], dtype=dtype)
    if dtype != torch.uint8:
        a[1], a[6] = -1, -7
    bits = torch.iinfo(dtype).bits
    shift = torch.tensor([0, 1, 3, bits - 1, bits, bits + 5, 2, 1], dtype=dtype)
    fn = lambda a, s: (a & s, a | 6, a ^ s, ~a, a << s, a >> s, a << 2, a >> 1)  # noqa: E731
    programs = check(fn, a, shift, exact=True, lowered=[aten.bitwise_and.Tensor, aten.bitwise_or.Scalar,
                     aten.bitwise_xor.Tensor, aten.bitwise_not.default, aten.__lshift__.Tensor, aten.__rshift__.Tensor,
                     aten.__lshift__.Scalar, aten.__rshift__.Scalar])
    assert not programs["cpp"].externs


def test_negative_shift_amounts_bools_and_scalar_code():
    a, s = torch.tensor([5, -5, 1, -1, 2**62]), torch.tensor([-1, -1, -64, 65, 64])
    b, c = torch.tensor([True, False, True, False]), torch.tensor([True, True, False, False])
    # 0-d results run as scalar code, where x86 masks the shift count (vector shifts saturate).
    fn = lambda a, s, b, c: (a << s, a >> s, b & c, b | c, b ^ c, ~b, b & 1, a[4] >> s[4], a[4] << s[4], a[0] >> s[0])  # noqa: E731
    check(fn, a, s, b, c, exact=True, lowered=[aten.bitwise_not.default, aten.bitwise_and.Tensor])


def test_integer_division_by_nonzero_numbers_rounds_like_eager():
    a = torch.tensor([7, -7, 6, -6, 0, 1, -1, 2**40 + 3])
    fn = lambda a: (a // 2, a // -3, torch.div(a, 4, rounding_mode="trunc"), torch.div(a, -4, rounding_mode="trunc"),  # noqa: E731
                    torch.div(a, 4, rounding_mode="floor"), a % 3, a % -3, torch.fmod(a, 3), torch.fmod(a, -3),
                    torch.remainder(a.to(torch.int8), 5), a / 4)
    programs = check(fn, a, exact=True, lowered=[aten.div.Tensor_mode, aten.remainder.Scalar, aten.fmod.Scalar])
    assert not programs["cpp"].externs


def test_integer_division_by_a_tensor_stays_extern_and_raises_for_zero_like_eager():
    a, b = torch.tensor([7, -7]), torch.tensor([2, 0])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        a // b
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        through("reference", lambda a, b: a // b, a, b)
    _, program = through("reference", lambda a, b: (a // b, a % b), a, b.abs() + 1)
    assert extern_ops(program) == {aten.div.Tensor_mode, aten.remainder.Tensor}


def test_bool_arithmetic_is_logic():
    # Found by the graph fuzzer: true + true was the C++ int 2 in the scalar loop, so a max of it
    # with a bool did not compile.
    a, b = torch.rand(4, 7, 6) > 0.5, torch.rand(4, 1, 1) > 0.5
    fn = lambda a, b: (torch.maximum(a + b, a), (a * b) == a, (a + b).to(torch.int64) * 3)  # noqa: E731
    check(fn, a, b, exact=True)


def test_add_with_alpha_keeps_the_operands_dtype():
    # Found by the graph fuzzer: bool.add(bool, alpha=2) promoted b * 2 to int64 and stored the
    # int 2 into a bool tensor (a sum of it counted 2 per element; a where on it did not compile).
    a, b = torch.rand(4, 3) > 0.5, torch.rand(3) > 0.5
    i, j = torch.arange(12).reshape(4, 3), torch.arange(3)
    fn = lambda a, b, i, j: (a.add(b, alpha=2).sum(-1), torch.where(a.add(b, alpha=2), 1, 2), a.add(b, alpha=0),  # noqa: E731
                             i.add(j, alpha=-3), i.sub(j, alpha=2), i.add(5, alpha=2))
    check(fn, a, b, i, j, exact=True)
    x, y = torch.randn(4, 3).to(torch.bfloat16), torch.randn(3).to(torch.bfloat16)
    check(lambda x, y: (x.add(y, alpha=0.5), x.sub(y, alpha=3)), x, y, rtol=1.6e-2, atol=1e-2)


def test_sign_of_bools_is_the_bools():
    # Found by the graph fuzzer: the vector sign of a bool tensor did not compile.
    m = torch.rand(5, 37) > 0.5
    check(lambda m: (torch.sign(m), torch.sign(m).to(torch.int64) + 1), m, exact=True)
