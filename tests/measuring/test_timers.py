"""Timings a GPU can trust: every clock read in a timed region comes right after a device sync.

On a GPU a forward returns once its kernels are queued, so a clock read straight after it times the launch,
not the work. The CPU has nothing to wait for, so here a fake device stands in: its `sync` is counted, and
every read of the clock must follow one. A timer that reads the clock without a sync fails this test."""
import time

import pytest

import mtplab.decoding.loop as loop
import mtplab.device as device
import mtplab.measuring.regime as regime
import mtplab.measuring.timing as timing
from mtplab.decoding.batch import batched_speculative
from mtplab.decoding.drafters import SternDrafter
from mtplab.decoding.tree import tree_speculative
from tests.conftest import random_model


@pytest.fixture
def events(monkeypatch):
    log: list[str] = []
    real = time.perf_counter

    def fake_sync(device):
        log.append("sync")

    def clock():
        log.append("clock")
        return real()

    for mod in (device, timing):
        monkeypatch.setattr(mod, "sync", fake_sync)
    monkeypatch.setattr(time, "perf_counter", clock)
    return log


def _unsynced(log):
    return [i for i, e in enumerate(log) if e == "clock" and (i == 0 or log[i - 1] != "sync")]


def test_the_check_catches_a_clock_read_without_a_sync(events):
    """The control: a timer that forgets the sync is seen."""
    time.perf_counter()
    assert _unsynced(events) == [0]


def test_decoders_sync_before_every_clock_read(events):
    model = random_model("stern", 4, seed=1).eval()
    prompt = [1, 2, 3]
    loop.autoregressive(model, prompt, max_new_tokens=6)
    loop.speculative(model, SternDrafter(model), prompt, max_new_tokens=8, k=4)
    loop.speculative(model, SternDrafter(model), prompt, max_new_tokens=8, k=4, schedule="plain")
    tree_speculative(model, SternDrafter(model), prompt, max_new_tokens=8, widths=(2, 1))
    batched_speculative(model, SternDrafter, [prompt, [4, 5]], max_new_tokens=6, k=3)
    assert events.count("clock") > 20
    assert _unsynced(events) == []


def test_measurements_sync_before_every_clock_read(events):
    model = random_model(seed=2).eval()
    timing.measure_cost_curve(model, (1, 2), context=8, repeats=1)
    timing.batch_cost_ratio(model, 2, 2, context=8, repeats=1)
    regime.speedup_by_depth({"s": ("blockwise-overlap", random_model("stern", 3, seed=3).eval())}, [[1, 2]], (2,),
                            max_new_tokens=4, repeats=1)
    timing.measure_batch(random_model("stern", 3, seed=3).eval(), SternDrafter, [[1, 2]], batch_sizes=(2,),
                         max_new_tokens=4, k=3)
    timing.machine_balance(n=32, repeats=1)
    assert _unsynced(events) == []


def test_the_notebooks_live_timings_sync_too(events):
    from mtplab.measuring.race import race

    model = random_model("stern", 3, seed=4).eval()
    timing.interleaved_race("blockwise-overlap", model, [[1, 2, 3]], max_new_tokens=6, k=3, repeats=2)
    race({"ar": timing.untimed_output(lambda: None), "x": timing.untimed_output(lambda: None)}, [None], baseline="ar",
         rounds=2)
    from mtplab.teaching import bottleneck
    bottleneck.raced_decodes({"c": (model, True), "n": (model, False)}, [1, 2], max_new_tokens=4, repeats=1)
    assert _unsynced(events) == []
