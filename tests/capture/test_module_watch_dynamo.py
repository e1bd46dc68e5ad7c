"""kiln's module watch (kiln/capture/module_watch.py) wraps `nn.Module.__setattr__` and listens to
every parameter, buffer and submodule registration once kiln.compile has run. Code that
torch.compile (Dynamo) traces afterwards goes through those wrappers too; they must stay out of
its guards: a guard on kiln's set of watched modules made Dynamo recompile whenever kiln watched
another module, and crash (IndexError while building the guard) when a watched module died during
the compile, as the key/value-cache call of a HuggingFace decoder did (tests/test_default_config.py)."""

import gc

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
