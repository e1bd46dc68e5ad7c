"""kiln's module watch (kiln/capture/module_watch.py) wraps `nn.Module.__setattr__` and listens to
every parameter, buffer and submodule registration once kiln.compile has run. Code that
torch.compile (Dynamo) traces afterwards goes through those wrappers too; they must stay out of
its guards: a guard on kiln's set of watched modules made Dynamo recompile whenever kiln watched
another module, and crash (IndexError while building the guard) when a watched module died during
the compile, as the key/value-cache call of a HuggingFace decoder did (tests/test_default_config.py)."""

import gc

import pytest

import torch

import kiln


class Watched(torch.nn.Module):
    def forward(self, x):
        return x + 1


class RegistersInForward(torch.nn.Module):
    """Registers a buffer on a module made during forward (a HuggingFace decoder's key/value
    cache call does such a registration)."""

    def forward(self, x):
        holder = torch.nn.Module()
        holder.register_buffer("scale", torch.full((1,), 2.0))
        return x * holder.scale + 1


def test_dynamo_compiles_through_the_watch_while_a_watched_module_dies():
    watched = [Watched()]
    kiln.compile(watched[0], backend="eager")(torch.randn(3))
    compiles = []

    def dropping(gm, example_inputs):
        compiles.append(gm)
        watched.clear()  # the watched module dies during the compile (a collection can free it there)
        gc.collect()
        return gm.forward

    torch._dynamo.reset()
    fn = torch.compile(RegistersInForward(), backend=dropping)
    x = torch.randn(3)
    torch.testing.assert_close(fn(x), x * 2 + 1)
    assert len(compiles) == 1
    # kiln watching another module is no reason for Dynamo to compile again.
    kiln.compile(Watched(), backend="eager")(x)
    torch.testing.assert_close(fn(x), x * 2 + 1)
    assert len(compiles) == 1


def test_kiln_watching_another_module_does_not_make_dynamo_compile_again():
    kiln.compile(Watched(), backend="eager")(torch.randn(3))  # the watch is installed
    compiles = []

    def counting(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    torch._dynamo.reset()
    fn = torch.compile(RegistersInForward(), backend=counting)
    x = torch.randn(3)
    fn(x)
    another = Watched()
    kiln.compile(another, backend="eager")(x)
    torch.testing.assert_close(fn(x), x * 2 + 1)
    assert len(compiles) == 1


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.linear(x) * 2


def test_a_function_dynamo_compiled_before_kilns_first_capture_is_not_compiled_again():
    """Dynamo guards a frame on torch's global module-registration hook tables: kiln watches
    registrations without them, so that its first capture leaves what torch.compile compiled valid
    (Inductor's llama-160m in the llm suite compiled its prompt and its step again, ~20 s each,
    inside the first timed round after kiln's modes had run)."""
    from torch.nn.modules import module as module_file
    from kiln.capture import module_watch

    tables = (module_file._global_module_registration_hooks, module_file._global_parameter_registration_hooks,
              module_file._global_buffer_registration_hooks)
    compiles = []

    def counting(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    torch._dynamo.reset()
    model = Scaled()
    fn = torch.compile(model, backend=counting)
    x = torch.randn(2, 3)
    fn(x)
    assert len(compiles) == 1
    module_watch.STATE.installed = False  # (as in a process where kiln has not captured yet)
    kiln.compile(Watched(), backend="eager")(x)
    assert module_watch.STATE.installed
    assert all(len(table) == 0 for table in tables)
    torch.testing.assert_close(fn(x), model(x))
    assert len(compiles) == 1


class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.full((3,), 2.0))

    def forward(self, x):
        return x * self.scale + sum(p.sum() for p in self.parameters()) + len(list(self.children()))


@pytest.mark.parametrize("register", ["buffer", "parameter", "child", "child by assignment", "child removed"])
def test_a_registration_on_a_watched_module_after_compiling_is_followed(register):
    """Each way of registering on a module a capture read moves kiln's module version (the
    wrapped register_buffer, register_parameter, add_module and __setattr__): the next call
    captures again and gives eager's result."""
    model = Holder()
    model.add_module("extra", torch.nn.Identity())
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), model(x))
    if register == "buffer":
        model.register_buffer("scale", torch.full((3,), 5.0))
    elif register == "parameter":
        model.register_parameter("bias", torch.nn.Parameter(torch.ones(2)))
    elif register == "child":
        model.add_module("more", torch.nn.ReLU())
    elif register == "child by assignment":
        model.more = torch.nn.ReLU()
    else:
        model.extra = None
    torch.testing.assert_close(compiled(x), model(x))
