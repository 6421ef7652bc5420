"""The notebooks' kernels under nbval (make test): one kernel started alone first, and a kernel that dies before it
answers started once more, with what it printed.

    python -m tools.nbval_start                                      # start one kernel, run a cell, stop it
    pytest -n 2 --dist loadfile -p tools.nbval_start --nbval-lax notebooks/

nbval starts each notebook's kernel with its stderr sent to /dev/null, so a kernel that dies at start says only
"Kernel died before replying to kernel_info", for every cell of its notebook. CI saw that once for notebook 02 (the
last run of 2026-12-04, on a fresh machine, where the two workers started the first two kernels of that machine at
the same moment), and never here. So `make test` starts one kernel alone before the notebooks (what a kernel's
first start writes under the home folder is then written once; a failure there is printed, not fatal), and this
plugin keeps each kernel's stderr: a kernel that dies before its first answer is started once more, with a warning
that quotes what it printed, and a second death fails its notebook with that text.
"""
from __future__ import annotations

import sys
import tempfile
import warnings

TAIL = 2000  # characters of a dead kernel's stderr quoted


def _said(err) -> str:
    err.flush()
    err.seek(0)
    text = err.read()[-TAIL:].strip()
    return text or "(nothing on stderr)"


def keep_stderr(start):
    """`start` (nbval.kernel.start_new_kernel) with the kernel's stderr kept in a file and one more start after a
    death before the kernel's first answer."""
    def start_new_kernel(*args, **kw):
        for attempt in (1, 2):
            err = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
            try:
                return start(*args, **{**kw, "stderr": err})
            except RuntimeError as e:
                said = _said(err)
                err.close()
                if attempt == 2:
                    raise RuntimeError(f"{e} (twice); the kernel's stderr:\n{said}") from None
                warnings.warn(f"a notebook kernel died at start ({e}); started once more. Its stderr:\n{said}",
                              RuntimeWarning, stacklevel=2)
        raise AssertionError("unreachable")
    return start_new_kernel


def pytest_configure(config) -> None:
    import nbval.kernel as nk
    if not getattr(nk.start_new_kernel, "_kept", False):
        nk.start_new_kernel = keep_stderr(nk.start_new_kernel)
        nk.start_new_kernel._kept = True  # type: ignore[attr-defined]


def warm(timeout: float = 120) -> str:
    """Start one kernel alone, run one cell and stop it: what a first start writes is written once. A kernel that
    dies says why (its stderr)."""
    from jupyter_client.manager import start_new_kernel
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as err:
        try:
            km, kc = start_new_kernel(startup_timeout=timeout, stderr=err)
        except RuntimeError as e:
            raise SystemExit(f"a notebook kernel did not start alone ({e}); its stderr:\n{_said(err)}") from None
        try:
            reply = kc.execute_interactive("import sys", timeout=timeout, output_hook=lambda msg: None)
            return reply["content"]["status"]
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def main() -> int:
    """The warm-up never fails `make test` by itself: a kernel that cannot start is nbval's to report, notebook by
    notebook, with this plugin's stderr and second start."""
    try:
        status = warm()
    except (SystemExit, RuntimeError) as e:
        print(f"{e}\nnbval starts each notebook's kernel itself (with one more start after a death)", file=sys.stderr)
        return 0
    print(f"a notebook kernel started alone and ran a cell: {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
