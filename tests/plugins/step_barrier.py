"""Training hooks of a test's own (``training.hooks: [tests.plugins.step_barrier]``), so that a test
interrupts training at a step it chose, never after a delay that a faster or slower CPU turns into
another moment.

In the training process: after each global step listed in ``STEP_BARRIER_AT`` (comma-separated), the
hook writes ``<STEP_BARRIER_DIR>/paused-<step>-<pid>`` and waits until ``<STEP_BARRIER_DIR>/go-<step>``
exists (at most ``STEP_BARRIER_TIMEOUT_S``, default 600 s, then it raises). Without the variables it
does nothing. In the test: ``StepBarrier`` sets the variables for the processes it starts, waits for
the pause (the event) and lets training go on.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pipeline.train.hooks import StepInfo, TrainHooks

ROOT = Path(__file__).resolve().parents[2]


class BarrierTimeout(RuntimeError):
    """The test never released a paused step, or the training never reached it."""


def TRAIN_HOOKS(config) -> TrainHooks:  # noqa: N802 - the plug-in attribute's name
    """The pause, when ``STEP_BARRIER_DIR`` and ``STEP_BARRIER_AT`` are set; otherwise no hook."""
    folder, steps = os.environ.get("STEP_BARRIER_DIR"), os.environ.get("STEP_BARRIER_AT", "")
    if not folder or not steps:
        return TrainHooks()
    at = {int(step) for step in steps.split(",")}
    timeout_s = float(os.environ.get("STEP_BARRIER_TIMEOUT_S", "600"))

    def on_step(info: StepInfo) -> None:
        if info.step not in at:
            return
        go = Path(folder) / f"go-{info.step}"
        (Path(folder) / f"paused-{info.step}-{os.getpid()}").write_text(f"{info.step_in_epoch}\n")
        deadline = time.monotonic() + timeout_s
        while not go.exists():
            if time.monotonic() > deadline:
                raise BarrierTimeout(f"step {info.step}: {go} never appeared")
            time.sleep(0.05)

    return TrainHooks(on_step=on_step)


class StepBarrier:
    """The test's side: ``env`` for the training processes, ``config_yaml`` for their config, ``wait``
    for ``count`` processes to pause at a step, ``release`` to let them go on."""

    def __init__(self, folder: Path, *steps: int):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.steps = steps

    def env(self, base: dict | None = None) -> dict:
        """The environment for training processes: the barrier's variables, and this checkout first on
        ``PYTHONPATH`` so that ``tests.plugins`` imports in any child process."""
        env = dict(os.environ if base is None else base)
        env["STEP_BARRIER_DIR"] = str(self.folder)
        env["STEP_BARRIER_AT"] = ",".join(str(step) for step in self.steps)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        return env

    def install(self, monkeypatch) -> None:
        """Set the variables in this process (for children started by code under test)."""
        for name, value in self.env().items():
            if os.environ.get(name) != value:
                monkeypatch.setenv(name, value)

    @staticmethod
    def config_yaml() -> str:
        """The ``training.hooks`` entry a config needs (YAML, under ``training:``)."""
        return "  hooks: [tests.plugins.step_barrier]\n"

    def paused(self, step: int) -> dict[int, int]:
        """{pid: step in epoch} of the processes paused at ``step`` now."""
        found = {}
        for path in self.folder.glob(f"paused-{step}-*"):
            text = path.read_text()
            if text.endswith("\n"):  # written whole
                found[int(path.name.rsplit("-", 1)[1])] = int(text)
        return found

    def wait(self, step: int, alive, count: int = 1, timeout_s: float = 900) -> dict[int, int]:
        """Wait until ``count`` processes pause at ``step``; ``alive()`` is asked meanwhile and must stay
        true (a run that ended or failed first fails the test with its message)."""
        deadline = time.monotonic() + timeout_s
        while len(found := self.paused(step)) < count:
            status = alive()
            assert status is True, f"training ended before pausing at step {step}: {status}"
            assert time.monotonic() < deadline, f"no pause at step {step} within {timeout_s} s"
            time.sleep(0.05)
        return found

    def release(self, step: int) -> None:
        """Let the processes paused at ``step`` go on."""
        (self.folder / f"go-{step}").touch()
