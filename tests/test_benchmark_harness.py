"""benchmarks/harness.py's median_ms and interleaved_median_ms on a CPU machine, with a recording stand-in for torch:
each timed call is preceded by the L2 flush (unless turned off) and a device sleep (so the host's launch is hidden)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "benchmarks" / "harness.py"


def _harness():
    saved = list(sys.path)  # the harness puts the source tree first on sys.path
    try:
        spec = importlib.util.spec_from_file_location("bench_harness_under_test", HARNESS)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


class _FakeTorch:
    """What median_ms uses of torch, recording the order of the calls."""
    int8 = "int8"

    def __init__(self):
        self.log: list[str] = []
        log = self.log

        class Flush:
            def zero_(self):
                log.append("flush")

        class FakeEvent:
            def __init__(self, enable_timing=False):
                pass

            def record(self):
                log.append("record")

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return 2.0

        class Cuda:
            Event = FakeEvent

            @staticmethod
            def _sleep(cycles):
                log.append(f"sleep {cycles}")

        self.cuda = Cuda
        self._flush = Flush

    def empty(self, *args, **kwargs):
        return self._flush()


def test_median_ms_sleeps_on_the_device_before_each_timed_call(monkeypatch):
    harness = _harness()
    fake = _FakeTorch()
    monkeypatch.setattr(harness, "torch_cuda", lambda: fake)
    assert harness.median_ms(lambda: fake.log.append("fn"), warmup=1, reps=2) == 2.0
    sleep = f"sleep {harness.SLEEP_CYCLES}"
    assert fake.log == ["fn"] + ["flush", sleep, "record", "fn", "record"] * 2
    fake.log.clear()
    harness.median_ms(lambda: fake.log.append("fn"), warmup=0, reps=1, flush_l2=False)
    assert fake.log == [sleep, "record", "fn", "record"]


def test_interleaved_median_ms_times_every_side_each_round_from_a_rotating_start(monkeypatch):
    harness = _harness()
    fake = _FakeTorch()
    monkeypatch.setattr(harness, "torch_cuda", lambda: fake)
    fns = {name: (lambda name=name: fake.log.append(name)) for name in ("a", "b", "c")}
    assert harness.interleaved_median_ms(fns, warmup=1, reps=3, flush_l2=False) == {"a": 2.0, "b": 2.0, "c": 2.0}
    timed = [entry for entry in fake.log[3:] if entry in fns]
    assert fake.log[:3] == ["a", "b", "c"]  # the warm-up calls
    assert timed == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    sleep = f"sleep {harness.SLEEP_CYCLES}"
    assert fake.log[3:7] == [sleep, "record", "a", "record"]
