"""The lab's one race (mtplab.measuring.race): interleaving, ratios, identical outputs, and the busy-machine guard
firing under a load the test starts and staying quiet when only the race itself works."""
import subprocess
import sys
import time

import pytest

from mtplab.errors import MtplabError
from mtplab.measuring.race import busy_reason, race
from mtplab.platform_compat import cpu_seconds


def _spin(seconds: float):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass


def test_race_interleaves_and_reports_ratios():
    calls = []

    def make(name, seconds):
        def run(p):
            calls.append(name)
            _spin(seconds)
            return [p, p + 1] if name != "odd" else [p, 0]
        return run

    res = race({"base": make("base", 0.004), "fast": make("fast", 0.002), "odd": make("odd", 0.004)},
               [1, 2, 3], baseline="base", rounds=3)
    assert calls[:3] == ["base", "fast", "odd"]  # the warm-up, one call each
    timed = calls[3:]
    firsts = {timed[i] for i in range(0, len(timed), 3)}
    assert firsts == {"base", "fast", "odd"}  # every contender runs first somewhere: the order rotates
    assert res.row("fast")["speedup"] > 1.3
    assert res.identical("fast") == 3 and res.identical("odd") == 0
    assert len(res.ratios("fast")) == 3 and res.row("base")["speedup"] == pytest.approx(1.0)
    assert {"cpu", "threads", "torch"} <= set(res.machine)


def test_race_refuses_bad_input():
    with pytest.raises(MtplabError, match="baseline"):
        race({"a": lambda p: [p]}, [1], baseline="b")
    with pytest.raises(MtplabError, match="rounds"):
        race({"a": lambda p: [p]}, [1], baseline="a", rounds=0)
    with pytest.raises(MtplabError, match="prompt"):
        race({"a": lambda p: [p]}, [], baseline="a")


def test_busy_reason_reads_load_and_spread():
    assert busy_reason(0.05, 0.05) is None
    assert "cores" in busy_reason(0.9, 0.05)
    assert "differ" in busy_reason(0.0, 0.6)


@pytest.mark.serial
@pytest.mark.skipif(cpu_seconds() is None, reason="the load meter reads psutil, which is not installed")
def test_guard_fires_under_a_load_the_test_starts():
    load = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        res = race({"a": lambda p: _spin(0.05) or [p], "b": lambda p: _spin(0.05) or [p]}, list(range(8)),
                   baseline="a", rounds=2)
    finally:
        load.kill()
        load.wait()
    assert not res.valid and "other processes" in res.busy
    assert "not valid here" in res.verdict() and "rerun" in res.verdict()


@pytest.mark.serial
@pytest.mark.skipif(cpu_seconds() is None, reason="the load meter reads psutil, which is not installed")
def test_guard_stays_quiet_on_an_idle_run():
    """Run alone (make test runs the serial tests after the parallel ones): the race's own CPU time is subtracted,
    so a race that works both cores' worth by itself still reads as idle."""
    res = race({"a": lambda p: _spin(0.05) or [p], "b": lambda p: _spin(0.05) or [p]}, list(range(8)),
               baseline="a", rounds=2)
    assert res.valid, res.busy
    assert res.others_cores is not None and res.others_cores < 0.25


def test_one_stray_round_is_not_a_busy_machine_but_rounds_that_keep_disagreeing_are():
    from mtplab.measuring.race import round_spread

    assert round_spread([1.0, 1.02, 1.01, 1.6, 0.99]) < 0.05  # one slow round among five: left out
    assert round_spread([1.0, 1.4, 1.7, 1.0, 1.4]) > 0.25     # they keep disagreeing
    assert round_spread([1.0, 1.4]) == pytest.approx(0.4 / 1.2)  # two or three rounds: the whole range
    assert round_spread([1.0]) is None
