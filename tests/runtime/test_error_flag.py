"""A GPU graph's index-error flag, read without waiting for the GPU: each call queues a copy of the
flag and reads the copies of earlier calls the GPU has passed, at most `MAX_UNREAD` calls behind.
Checked with stand-in copies whose readiness the test decides (the real ones are CUDA events over
pinned memory, run by tests/gpu)."""

import pytest
import torch

from kiln.runtime import compiled_graph, error_flag
from kiln.runtime.error_flag import MAX_UNREAD, ErrorFlag, HostCopy


class Stream:
    """Stand-in copies of the flag: each holds the flag's value when it was queued; `done` of them
    have been passed by the stand-in GPU."""

    def __init__(self, flag: torch.Tensor) -> None:
        self.flag, self.copies, self.done, self.waited = flag, [], 0, 0

    def copy(self, tensor):
        stream, value, position = self, int(tensor[0]), len(self.copies)

        class Copy:
            def ready(self):
                return position < stream.done

            def read(self):
                if position >= stream.done:
                    stream.waited += 1  # the host waits for the GPU
                return value

        self.copies.append(Copy())
        return self.copies[-1]


def test_the_flag_is_read_without_waiting_and_reports_a_later_call():
    tensor = torch.zeros(1, dtype=torch.int32)
    stream = Stream(tensor)
    flag = ErrorFlag(tensor, copy=stream.copy)
    assert flag._read_without_waiting() == 0  # call 1: its copy not reached yet, nothing waited for
    tensor[0] = 1  # call 2 reads an index out of range
    assert flag._read_without_waiting() == 0 and stream.waited == 0
    stream.done = 2  # the GPU passed both calls' copies
    assert flag._read_without_waiting() == 1 and flag.late_by == 1  # reported by call 3
    with pytest.raises(IndexError, match="1 call before this one"):
        compiled_graph._raise_index_error(flag, "kernel_x")
    assert int(tensor[0]) == 0 and not flag.unread  # cleared, and copies queued before forgotten


def test_the_host_waits_once_it_is_too_far_ahead():
    tensor = torch.ones(1, dtype=torch.int32)
    stream = Stream(tensor)
    flag = ErrorFlag(tensor, copy=stream.copy)
    results = [flag._read_without_waiting() for _ in range(MAX_UNREAD + 1)]
    assert results == [0] * MAX_UNREAD + [1] and stream.waited == 1  # the oldest copy, waited for
    assert flag.late_by == MAX_UNREAD


def test_a_cpu_flag_is_read_at_once():
    tensor = torch.ones(1, dtype=torch.int32)
    flag = ErrorFlag(tensor)
    assert flag.value == 1 and flag.when() == ""
    flag.value = 0
    assert int(tensor[0]) == 0


def test_a_copy_the_gpu_has_passed_is_read_without_a_wait(monkeypatch):
    """The oldest copy, read because the host is `MAX_UNREAD` calls ahead, is waited for only where
    its event has not passed: asked first (a synchronize is a wait to the profiler and a driver
    call, even on a passed event)."""

    class Event:
        def __init__(self, passed):
            self.passed, self.waits = passed, 0

        def query(self):
            return self.passed

        def synchronize(self):
            self.waits += 1

    monkeypatch.setattr(error_flag, "_READ_BUFFERS", [])  # (where read buffers go for reuse: not pinned here)
    for passed in (True, False):
        copy = object.__new__(HostCopy)
        copy.host, copy.event, copy.passed = torch.ones(1, dtype=torch.int32), Event(passed), False
        assert copy.read() == 1 and copy.event.waits == (0 if passed else 1)
