"""A CUDA graph's outputs handed out without a copy per replay (kiln/runtime/replay_outputs.py),
checked on the CPU with a stand-in for the recorded graph: a function that writes fixed buffers,
as a replay writes fixed addresses."""

import gc

import pytest
import torch

from kiln.native import python_door
from kiln.runtime import replay_outputs
from kiln.runtime.cuda_graphs import CudaGraphed, _Recording
from kiln.runtime.replay_outputs import ReplayOutputs


@pytest.fixture(params=["torch", "kiln"])
def swap_by(request, monkeypatch):
    """Moves done by torch's `_swap_data_ptr_` or by kiln's extension (what torch 2.11, which lacks
    the method, gets)."""
    if request.param == "kiln":
        monkeypatch.setattr(replay_outputs, "swap_memory", python_door.module().swap_storage_memory)
    return request.param


class _Replay:
    """Writes `value` into the recording's buffers, as a CUDA graph replay would."""

    def __init__(self, buffers, source):
        self.buffers, self.source, self.calls = buffers, source, 0

    def replay(self):
        self.calls += 1
        for buffer in self.buffers:
            buffer.copy_((self.source.sum() * self.calls).expand_as(buffer))


def _recording():
    pool = torch.zeros(4, 6)
    logits, last = pool, pool[:, -1]  # two outputs on one buffer: a view stays a view
    loss = torch.zeros(())
    weight = torch.ones(3)  # module state returned as is: not the recording's memory
    source = torch.ones(1)
    return _Replay([pool, loss], source), [logits, last, loss, weight], [weight, source]


def test_outputs_are_the_recordings_memory_until_the_caller_keeps_them_across_a_replay(swap_by):
    graph, buffers, inputs = _recording()
    handout = ReplayOutputs(buffers, inputs=inputs)
    handout.before_replay()
    graph.replay()
    logits, last, loss, weight = handout.hand_out()
    assert logits.data_ptr() == buffers[0].data_ptr() and loss.data_ptr() == buffers[2].data_ptr()  # no copy
    assert last.untyped_storage().data_ptr() == logits.untyped_storage().data_ptr()
    assert last.storage_offset() == 5 and last.stride() == (6,)
    assert weight.data_ptr() != buffers[3].data_ptr()  # state is cloned: it is not ours to hand out
    assert handout.copies == 0

    kept_view = last[1:]
    del last
    handout.before_replay()  # the caller holds logits (and views of it) and loss: both move
    graph.replay()
    logits2, last2, loss2, _ = handout.hand_out()
    assert handout.copies == 2
    assert logits.data_ptr() != buffers[0].data_ptr() and kept_view.data_ptr() != buffers[0].data_ptr() + 6 * 4
    torch.testing.assert_close(logits, torch.full((4, 6), 1.0))  # earlier results keep their values
    torch.testing.assert_close(kept_view, torch.full((3,), 1.0))
    torch.testing.assert_close(loss, torch.tensor(1.0))
    torch.testing.assert_close(logits2, torch.full((4, 6), 2.0))
    assert logits2.data_ptr() == buffers[0].data_ptr() and last2[0].item() == 2.0

    kept_view.mul_(10)  # the moved result is the caller's own memory now
    torch.testing.assert_close(logits[1:, -1], torch.full((3,), 10.0))
    assert buffers[0][1, -1].item() == 2.0

    del logits2, last2, loss2
    gc.collect()
    handout.before_replay()  # nothing of the second replay is held: no copy
    graph.replay()
    assert handout.copies == 2
    torch.testing.assert_close(logits[:, :-1], torch.full((4, 5), 1.0))  # untouched by the third replay


def test_a_dropped_recording_moves_what_the_caller_holds_first(swap_by):
    graph, buffers, inputs = _recording()
    handout = ReplayOutputs(buffers, inputs=inputs)
    graph.replay()
    logits = handout.hand_out()[0]
    handout.release()
    buffers[0].fill_(-1)  # the recording's memory, reused by whatever comes next
    torch.testing.assert_close(logits, torch.full((4, 6), 1.0))


def test_replays_through_cuda_graphed_hand_out_without_copies_and_keep_earlier_results():
    graph, buffers, inputs = _recording()
    x_buffer = torch.zeros(1)
    graph.source = x_buffer  # the replay reads the recording's own input buffer
    recording = _Recording(graph, [inputs[0], x_buffer], buffers, copied=[1])
    graphed = CudaGraphed(lambda *a: None, static_positions=[0], label="g")
    first = graphed._replay(recording, [inputs[0], torch.tensor([3.0])])
    second = graphed._replay(recording, [inputs[0], torch.tensor([5.0])])
    torch.testing.assert_close(first[0], torch.full((4, 6), 3.0))  # held across the replay: moved
    torch.testing.assert_close(second[0], torch.full((4, 6), 10.0))
    assert second[0].data_ptr() == buffers[0].data_ptr() and recording.handout.copies == 2


def test_an_input_handed_out_by_a_recording_is_read_in_place_until_it_moves():
    from kiln.runtime import fallback
    from kiln.runtime.cuda_graphs import _key
    from kiln.runtime.replay_outputs import handed_out

    forward_graph, buffers, inputs = _recording()  # the forward: its outputs stay at their addresses
    forward = ReplayOutputs(buffers, inputs=inputs)
    forward_graph.replay()
    saved = forward.hand_out()[0]
    assert handed_out(saved) and handed_out(saved[1:]) and not handed_out(torch.zeros(3))

    grad = torch.zeros(())  # the backward reads `saved` where the forward wrote it: no copy in
    backward_graph = _Replay([grad], buffers[0])
    backward = _Recording(backward_graph, [None], [grad], copied=[], in_place=[(0, saved.data_ptr())],
                          check_versions=False)
    uncaptured = []
    graphed = CudaGraphed(lambda s: uncaptured.append(s) or [s.sum() * 7], label="g")
    graphed.recordings[_key([saved])] = backward
    fallback.reset()
    graphed(saved)
    assert backward_graph.calls == 1 and uncaptured == [] and backward.handout.copies == 0

    forward.before_replay()  # a second forward before this backward: `saved` moves to its own memory
    forward_graph.replay()
    (out,) = graphed(saved)
    assert backward_graph.calls == 1 and len(uncaptured) == 1  # run without the CUDA graph, right
    torch.testing.assert_close(out, saved.sum() * 7)
    graphed(saved)
    assert [f.reason for f in fallback.FALLBACKS] == [
        "NoCudaGraph: an input the CUDA graph reads in place (another recording's output) has moved, e.g. two forward calls "
        "before their backwards: such calls run without it"]  # said once


def test_the_extensions_storage_swap_exchanges_memory_size_and_owner():
    swap = python_door.module().swap_storage_memory
    a, b = torch.arange(6.0), torch.full((10,), -1.0)
    a_ptr, b_ptr = a.data_ptr(), b.data_ptr()
    a_view = a[2:]
    swap(a.untyped_storage(), b.untyped_storage())
    assert a.data_ptr() == b_ptr and b.data_ptr() == a_ptr
    assert a.untyped_storage().nbytes() == 40 and b.untyped_storage().nbytes() == 24
    torch.testing.assert_close(a, torch.full((6,), -1.0))  # the tensor's own sizes read the new memory
    torch.testing.assert_close(a_view, torch.full((4,), -1.0))  # and so do its views
    del b  # b's storage owns a's old memory now: freeing it leaves a intact
    gc.collect()
    torch.testing.assert_close(a, torch.full((6,), -1.0))
    with pytest.raises(TypeError, match="UntypedStorage"):
        swap(a, a.untyped_storage())
