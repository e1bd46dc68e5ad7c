"""try/except/else/finally inside captured code, and exceptions that leave the compiled function.

PYTEST_DONT_REWRITE: the `assert` statements of the captured functions must be plain Python's.
"""

import pytest
import torch

import kiln
from tests.capture.util import check, op_count


class CustomError(ValueError):
    pass


def test_try_without_exception_runs_else_and_finally():
    def f(x):
        log = []
        try:
            y = x * 2
            log.append("try")
        except ValueError:
            y = x
            log.append("except")
        else:
            y = y + 1
            log.append("else")
        finally:
            log.append("finally")
        return y, log

    compiled = check(f, torch.randn(3))
    assert op_count(compiled) == 2


def test_raise_caught_in_same_function():
    def f(x, limit):
        try:
            if limit < 3:
                raise ValueError("too small", limit)
            y = x + 1
        except ValueError as e:
            y = x - e.args[1]
            msg = e.args[0]
        else:
            msg = "fine"
        return y, msg

    check(f, torch.randn(3), 1)
    check(f, torch.randn(3), 5)


def test_raise_class_without_arguments_and_custom_subclass():
    def f(x):
        out = []
        try:
            raise KeyError
        except LookupError as e:
            out.append(len(e.args))
        try:
            raise CustomError("custom")
        except ValueError as e:
            out.append(e.args[0])
        return x + len(out), out

    check(f, torch.randn(3))


def test_exception_in_inlined_callee_caught_by_caller():
    def validate(t, k):
        if k < 0:
            raise ValueError("negative", k)
        return t * k

    def deeper(t, k):
        return validate(t, k) + 1

    def f(x):
        try:
            a = deeper(x, -2)
        except ValueError as e:
            a = x * e.args[1]
        b = deeper(x, 3)
        return a, b

    check(f, torch.randn(3))


def test_except_tuple_of_classes_and_order():
    def classify(k):
        try:
            if k == 0:
                raise KeyError("k")
            if k == 1:
                raise IndexError("i")
            if k == 2:
                raise TypeError("t")
            return "none"
        except (KeyError, IndexError) as e:
            return "lookup:" + e.args[0]
        except (ValueError, TypeError) as e:
            return "value:" + e.args[0]

    def f(x):
        return x, [classify(k) for k in range(4)]

    check(f, torch.randn(2))


def test_finally_runs_on_both_paths():
    def run(log, fail):
        try:
            log.append("body")
            if fail:
                raise RuntimeError("boom")
            log.append("after")
        finally:
            log.append("finally")

    def f(x):
        log = []
        run(log, False)
        try:
            run(log, True)
        except RuntimeError:
            log.append("caught")
        return x + len(log), log

    check(f, torch.randn(3))


def test_finally_runs_on_return_and_break():
    def g(log):
        try:
            return "returned"
        finally:
            log.append("finally-return")

    def f(x):
        log = [g([])]
        for i in range(5):
            try:
                if i == 2:
                    break
                x = x + i
            finally:
                log.append(i)
        return x, log

    check(f, torch.randn(3))


def test_keyerror_from_dict_lookup_caught():
    def f(x, d):
        try:
            v = d["missing"]
        except KeyError as e:
            v = x * 2
            key = e.args[0]
        return v + d["a"], key

    check(f, torch.randn(3), {"a": torch.randn(3)})


def test_indexerror_from_list_caught():
    def f(x):
        items = [x, x * 2]
        try:
            return items[5]
        except IndexError:
            return items[-1]

    check(f, torch.randn(3))


def test_attributeerror_from_getattr_caught():
    class Config:
        scale = 2.0

    cfg = Config()

    def f(x):
        try:
            shift = cfg.shift
        except AttributeError:
            shift = 1.0
        return x * cfg.scale + shift, getattr(cfg, "other", 5), hasattr(cfg, "scale")

    check(f, torch.randn(3))


def test_nested_try():
    def f(x):
        log = []
        try:
            try:
                raise KeyError("inner")
            except KeyError:
                log.append("inner handled")
                raise ValueError("outer")
            finally:
                log.append("inner finally")
        except ValueError as e:
            log.append(e.args[0])
        try:
            try:
                raise TypeError("not matched inside")
            except KeyError:
                log.append("wrong")
        except TypeError:
            log.append("matched outside")
        return x + 1, log

    check(f, torch.randn(3))


def test_bare_reraise_caught_outside():
    def inner():
        try:
            raise ValueError("again")
        except ValueError:
            raise

    def f(x):
        try:
            inner()
        except ValueError as e:
            return x * 2, e.args
        return x, ()

    check(f, torch.randn(3))


def test_exception_state_restored_after_handler():
    def f(x):
        try:
            raise ValueError("first")
        except ValueError:
            pass
        try:
            raise KeyError("second")
        except KeyError as e:
            second = e.args[0]
        return x, second

    check(f, torch.randn(3))


def test_assert_that_holds():
    def f(x, n):
        assert n > 0, "n must be positive"
        assert x.dim() == 1
        return x * n

    check(f, torch.randn(3), 2)


def test_exception_escaping_compiled_function_raises_as_eager():
    def f(x, k):
        if k < 0:
            raise ValueError("negative k", k)
        return x * k

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    with pytest.raises(ValueError, match="negative k") as info:
        compiled(x, -1)
    assert info.value.args == ("negative k", -1)
    torch.testing.assert_close(compiled(x, 2), x * 2)


def test_exception_from_inlined_callee_escaping():
    def lookup(d, key):
        return d[key]

    def f(x, d):
        return x + lookup(d, "missing")

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    with pytest.raises(KeyError):
        compiled(torch.randn(3), {"present": 1})


def test_failing_assert_raises_assertion_error():
    def f(x, n):
        assert n > 0, "n must be positive"
        return x * n

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    with pytest.raises(AssertionError, match="n must be positive"):
        compiled(torch.randn(3), -1)


def test_exception_escaping_after_side_effects_runs_them_once():
    def f(x, log):
        log.append("before")
        raise RuntimeError("late")

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    log = []
    with pytest.raises(RuntimeError, match="late"):
        compiled(torch.randn(3), log)
    assert log == ["before"]


def test_raise_from_and_exception_chaining_in_handler():
    def f(x):
        try:
            try:
                raise KeyError("k")
            except KeyError as e:
                raise ValueError("wrapped") from e
        except ValueError as e:
            msg = e.args[0]
        return x + 1, msg

    check(f, torch.randn(3))


def test_with_block_exiting_normally():
    def f(x):
        with torch.no_grad():
            y = x * 2
        return y, torch.is_grad_enabled()

    check(f, torch.randn(3))


class CodedError(Exception):
    def __init__(self, code, *, detail="none"):
        super().__init__(f"code {code}")
        self.code, self.detail = code, detail


def test_exception_class_with_its_own_init():
    def f(x):
        try:
            raise CodedError(3, detail="bad")
        except CodedError as e:
            return x + e.code, e.args, e.detail, str(e)

    check(f, torch.randn(3))


def test_exception_with_own_init_escaping_raises_as_eager():
    def f(x):
        raise CodedError(7)

    with pytest.raises(CodedError) as info:
        kiln.compile(f, backend="eager", fullgraph=True)(torch.randn(3))
    assert info.value.code == 7 and info.value.args == ("code 7",)


def test_bare_except_and_continue_in_loop():
    def f(x):
        out = []
        for i in range(4):
            try:
                if i % 2:
                    raise ValueError(i)
                out.append(x * i)
            except:  # noqa: E722
                continue
        return out

    check(f, torch.randn(3))


def test_stopiteration_from_next_caught():
    def f(x):
        it = iter([x])
        first = next(it)
        try:
            next(it)
        except StopIteration:
            return first + 1
        return first

    check(f, torch.randn(3))


def test_exception_introspection_and_raise_from_none():
    def f(x):
        try:
            raise ValueError("a") from None
        except ValueError as e:
            return x, isinstance(e, ValueError), isinstance(e, KeyError), type(e).__name__, repr(e), str(e)

    check(f, torch.randn(3))


def test_exception_from_constant_builtin_call_caught():
    def f(x):
        try:
            n = int("abc")
        except ValueError as err:
            n = len(str(err))
        return x * n

    check(f, torch.randn(3))


def test_context_manager_suppressing_exception():
    import contextlib

    class SuppressKeyError:
        def __enter__(self):
            return self

        def __exit__(self, exc_type, exc, tb):
            return exc_type is not None and issubclass(exc_type, KeyError)

    def f(x):
        with SuppressKeyError():
            x = x + 1
            raise KeyError("k")
        with contextlib.suppress(ValueError):
            raise ValueError
        return x

    check(f, torch.randn(3))


def test_tensor_op_error_is_a_capture_error_and_falls_back():
    # A shape error found on fake tensors is not turned into the user's RuntimeError (yet).
    def f(x):
        try:
            x + torch.ones(5)
        except RuntimeError:
            return x
        return x * 2

    x = torch.randn(3)
    with pytest.raises(kiln.CaptureError):
        kiln.compile(f, backend="eager", fullgraph=True)(x)
    torch.testing.assert_close(kiln.compile(f, backend="eager")(x), x)


def test_exception_inside_no_grad_restores_grad_mode():
    def f(x):
        try:
            with torch.no_grad():
                y = x * 2
                raise ValueError("in no_grad")
        except ValueError:
            pass
        return y, torch.is_grad_enabled(), x * 3

    check(f, torch.randn(3))


def test_return_in_finally_overrides_and_finally_on_continue():
    def g(x):
        try:
            return x + 1
        finally:
            return x + 2  # noqa: B012

    def f(x):
        out = []
        for i in range(3):
            try:
                if i == 1:
                    continue
                out.append(i)
            finally:
                out.append(-i)
        return g(x), out

    check(f, torch.randn(3))


def test_finally_then_outer_handler():
    def f(x):
        y = x
        try:
            try:
                raise ValueError("a")
            finally:
                y = y + 1
        except ValueError:
            y = y * 2
        return y

    check(f, torch.randn(3))


def test_exceptions_raised_by_python_operations_caught():
    import math

    def f(x):
        r = []
        try:
            r.append([1 // (i - 2) for i in range(4)])
        except ZeroDivisionError as e:
            r.append(str(e))
        try:
            math.sqrt(-1)
        except ValueError as e:
            r.append(str(e))
        try:
            [1, 2].index(5)
        except ValueError as e:
            r.append(str(e))
        try:
            {}.pop("zz")
        except KeyError as e:
            r.append(repr(e))
        try:
            None.foo
        except AttributeError as e:
            r.append(str(e))
        try:
            1 + "a"
        except TypeError as e:
            r.append(str(e))
        return x, r

    check(f, torch.randn(3))


def test_exceptions_made_and_returned_are_new_objects_each_call():
    class WithInit(Exception):
        def __init__(self, a):
            super().__init__(a)
            self.a = a

    def f(x):
        return x.sin(), StopIteration(1, 2, x), WithInit(3), ValueError("m")

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.ones(1)
    first, second = compiled(x), compiled(x)
    assert first[1].args[:2] == (1, 2) and torch.equal(first[1].args[2], x) and str(first[3]) == "m"
    assert first[2].a == 3 and first[2] is not second[2] and first[1] is not second[1]
