"""tools.nbval_start: a notebook kernel that dies at start is started once more, and what it printed is shown."""
import pytest

from tools.nbval_start import keep_stderr


def _start(deaths: int, said: str = "zmq.error.ZMQError: Address already in use"):
    calls = []

    def start(*args, stderr=None, **kw):
        calls.append(kw)
        if len(calls) <= deaths:
            stderr.write(said + "\n")
            raise RuntimeError("Kernel died before replying to kernel_info")
        return "km", "kc"
    return start, calls


def test_a_kernel_that_starts_is_returned_with_its_stderr_kept():
    start, calls = _start(0)
    assert keep_stderr(start)(kernel_name="python3", cwd="nb") == ("km", "kc")
    assert calls == [{"kernel_name": "python3", "cwd": "nb"}]


def test_one_death_at_start_is_started_again_and_quoted():
    start, calls = _start(1)
    with pytest.warns(RuntimeWarning, match="died at start.*\n.*Address already in use"):
        assert keep_stderr(start)(kernel_name="python3") == ("km", "kc")
    assert len(calls) == 2


def test_two_deaths_fail_with_what_the_kernel_printed():
    start, calls = _start(2, said="Traceback ... ModuleNotFoundError: No module named 'ipykernel'")
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="(?s)twice.*No module named 'ipykernel'"):
        keep_stderr(start)()
    assert len(calls) == 2


def test_the_warm_up_reports_a_failed_start_without_failing(monkeypatch, capsys):
    import tools.nbval_start as ns

    def dead(timeout=120):
        raise SystemExit("a notebook kernel did not start alone (Kernel died); its stderr:\nboom")
    monkeypatch.setattr(ns, "warm", dead)
    assert ns.main() == 0
    assert "boom" in capsys.readouterr().err
