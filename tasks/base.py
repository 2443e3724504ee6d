"""What every task shares: the ``--config`` parameter and progress reporting."""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import ClassVar

import luigi
from tqdm import tqdm

from native_client.quiet import import_tensorflow_quietly
from pipeline.config import Config
from pipeline.config_loader import load_config
from pipeline.dag import Stage, stage, stages_by_task, upstream
from pipeline.layout import Layout
from pipeline.locks import LockBusy, shared_locks
from pipeline.stages.outputs import node_outputs, read_locks, warm_start_lock
from tasks.errors import StageError

log = logging.getLogger("luigi-interface")


def _unusable_errors() -> tuple:
    from native_client.metadata import ExportError
    from pipeline.config import ConfigError
    from pipeline.features.cache import CacheError
    from pipeline.lm.files import LanguageModelDamaged
    from pipeline.reports import ReportError

    return (ReportError, CacheError, ExportError, LanguageModelDamaged, ConfigError)


class ConfigParameter(luigi.Parameter):
    """``--config``: the path of a YAML config file. Given on the command line (``luigi --module tasks
    Train --config my.yaml``), the config and the input files it names are checked once, before anything
    is scheduled: a mistake is one line on stderr and exit status 2, as with ``deepspeech-train``, instead
    of the same error from every task's ``complete()`` and a failed run's summary."""

    def parse(self, x):
        """Check the config at ``x`` (``tasks.preflight.check_inputs``, and ``check_training`` for the
        command line's task); returns ``x``."""
        from luigi.cmdline_parser import CmdlineParser

        from pipeline.config import ConfigError
        from tasks.preflight import PreflightError, check_inputs, check_objective_reach, check_training

        try:
            config = load_config(x)
            check_inputs(config)
            parser = CmdlineParser.get_instance()
            if parser is not None:
                check_objective_reach(config, parser.known_args.root_task)
                check_training(config, parser.known_args.root_task)
        except (ConfigError, PreflightError) as error:
            print(f"error: {error}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        return x


# luigi.cfg's [core] rpc-* keys are read by Luigi's RPC client (luigi/rpc.py), not by a parameter of
# luigi.interface.core, which then warns that they are "not consumed": declared consumed here, so that
# `luigi --module tasks ...` does not warn about the project's own settings.
luigi.interface.core.ignore_unconsumed = set(luigi.interface.core.ignore_unconsumed) | {
    "rpc_connect_timeout",
    "rpc_retry_attempts",
    "rpc_retry_wait",
    "rpc_log_retries",
}


def task_parameter() -> luigi.Parameter:
    """``--task``: which task of a multi-task config (``multitask.tasks[].name``) a stage instance is of;
    empty (the default) in a single-task config."""
    return luigi.Parameter(
        default="", description="The task of a multi-task config (multitask.tasks[].name); none otherwise."
    )


@functools.cache
def task_class(name: str) -> type[ConfigTask]:
    """The Luigi task that runs stage ``name`` (``find_task`` of its declaration)."""
    return find_task(stage(name))


def find_task(declared: Stage) -> type[ConfigTask]:
    """The Luigi task that runs the ``declared`` stage: the class of ``tasks/<module>.py`` (the module
    beside ``pipeline/stages/<module>.py``, which declares the stage) whose ``stage`` names it, with the
    name the declaration gives. TypeError naming the module when there is none, or more than one."""
    module = importlib.import_module(f"tasks.{declared.module}")
    found = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, ConfigTask)
        and value.__dict__.get("stage") == declared.name
    ]
    if len(found) != 1 or found[0].__name__ != declared.task:
        names = ", ".join(cls.__name__ for cls in found) or "none"
        raise TypeError(
            f"tasks/{declared.module}.py: stage {declared.name!r} is run by one ConfigTask named "
            f"{declared.task} with stage = {declared.name!r} (found: {names})"
        )
    return found[0]


def pipeline_tasks() -> dict[str, type[luigi.Task]]:
    """Every task a command line can name, by name: each stage's task and the task that runs every
    instance of a stage with parameters (``Features``, ``Imports``), in the order of ``stages()``."""
    return {
        name: task_class(declared.name)
        if name == declared.task
        else getattr(importlib.import_module(f"tasks.{declared.module}"), name)
        for name, declared in stages_by_task().items()
    }


class ConfigTask(luigi.Task):
    """A task driven by one YAML config file, running one stage of ``pipeline.dag``.

    A subclass names its ``stage``; its Luigi parameters besides ``config`` are the
    stage's parameters, and ``requires()`` is the stage's declared upstream.
    """

    config = ConfigParameter(description="Path of the YAML config file (see configs/).")
    # The stage of pipeline.dag this task runs.
    stage: ClassVar[str] = ""
    # Stages that load TensorFlow have it imported first with its start-up chatter filtered.
    needs_tensorflow = False

    def stage_params(self) -> dict:
        """This task's stage parameters (its Luigi parameters other than ``config``)."""
        return {name: getattr(self, name) for name in stage(self.stage).params}

    def requires(self):
        """The tasks of the stages the declaration says this one reads: ``{"train": Train(...),
        "features_dev": FeaturesSplit(split="dev"), ...}``."""
        try:
            nodes = upstream(self.cfg, self.stage, self.stage_params())
        except _unusable_errors():
            return {}  # a bad config: complete() logged it and run() fails with it in one line
        needs = {}
        for name, params in nodes:
            key = "_".join([name, *(str(value) for value in params.values())])
            needs[key] = task_class(name)(config=self.config, **params)
        return needs

    def model_export(self, named) -> dict:
        """``{"model_export": Export(config=...)}`` when the model key ``named(layout)`` gives names a config
        (Align's aligner, Clean's scorer: that config's export, built first), else ``{}``."""
        try:
            config = self.layout.model_config(named(self.layout))
        except _unusable_errors():
            return {}
        return {} if config is None else {"model_export": task_class("export")(config=str(config))}

    @property
    def resources(self) -> dict:
        """What the stage takes of the machine (``tasks.resources``): a ``cpu`` share, ``gpu`` towers."""
        from tasks.resources import scheduler_totals, stage_resources

        try:
            return stage_resources(self.cfg, self.stage, scheduler_totals())
        except _unusable_errors():
            return {"cpu": 1}  # a bad config: the task fails at once with its one line

    @functools.cached_property
    def cfg(self) -> Config:
        """The loaded, validated config."""
        return load_config(self.config)

    @functools.cached_property
    def layout(self) -> Layout:
        """Every stage path and fingerprint of the config (each computed once); a task's layout for an
        instance of a multi-task config's task (``--task``)."""
        return Layout(self.cfg).for_task(getattr(self, "task", ""))

    def complete(self) -> bool:
        """``stage_complete()``; a damaged output it meets (a report, cache, export or LM file) or a bad
        config is logged as one line naming the file or key and makes the task run, and fail at once with
        that line, instead of raising here (a raising ``complete()`` left Luigi's worker waiting forever
        on its dependents)."""
        try:
            return self.stage_complete()
        except _unusable_errors() as error:
            log.error("%s", error)
            self._unusable = str(error)
            return False

    def stage_complete(self) -> bool:
        """Whether the stage's outputs exist and fit the config (default: the output exists)."""
        return super().complete()

    def run(self):
        """Fail at once with what ``complete()`` found wrong, else ``run_stage()`` (TensorFlow quiet) holding
        the locks of the outputs it reads shared (``pipeline.stages.outputs.read_locks``)."""
        # Luigi's status reporter (its scheduler and worker), kept for on_failure: Luigi unsets the task's
        # reporter methods before it calls on_failure (tasks.retries sends a final error's policy by it).
        self._status_reporter = getattr(self.set_tracking_url, "__self__", None)
        if getattr(self, "_unusable", None):
            raise StageError(self._unusable)
        if self.stage != "train":  # Train stops at the end of a step (pipeline.train.stop_signals)
            _stop_on_passed_on_signal(self.task_family)
        if self.needs_tensorflow:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            import_tensorflow_quietly()
        # The outputs this stage reads stay in use while it runs: gc and make rerun leave them alone.
        with shared_locks(read_locks(self.layout, self.stage, self.stage_params())), self._warm_start_lock():
            for needed in luigi.task.flatten(self.requires()):
                if not needed.complete():  # removed while this stage waited for its turn
                    raise StageError(
                        f"{needed.task_id}: its output was removed before {self.task_family} could read it "
                        "(gc or make rerun?); run the pipeline again to rebuild it"
                    )
            self.run_stage()

    @contextlib.contextmanager
    def _warm_start_lock(self):
        """Train's hold on the run ``training.init_from`` names (``outputs.warm_start_lock``), never waited
        for: a run still training is one line."""
        lock = warm_start_lock(self.layout, self.stage)
        try:
            with shared_locks([lock] if lock else [], wait=False):
                yield
        except LockBusy as busy:
            raise StageError(
                f"training.init_from {self.cfg.training.init_from}: that Train run is still being written "
                f"({busy}); warm-start once it has finished, or from a finished run"
            ) from None

    @property
    def retry_count(self) -> int:
        """Failures before the scheduler disables the task (``tasks.retries``: 1 after a config or data
        error, 6 for Train, else 2)."""
        from tasks.retries import retry_policy

        return retry_policy(self).failures

    @property
    def disable_window(self) -> int:
        """Seconds within which ``retry_count`` failures disable the task (``tasks.retries``)."""
        from tasks.retries import retry_policy

        return retry_policy(self).window_s

    def on_failure(self, exception) -> str:
        """The failure mail's and the scheduler's text (``tasks.mail.failure_text``); a config or data
        error is marked never to be retried (``tasks.retries.note_failure``)."""
        from tasks.mail import failure_text
        from tasks.retries import note_failure

        note_failure(self, exception)
        return failure_text(self, exception, super().on_failure(exception))

    def run_stage(self) -> None:
        """Do the stage's work (each task defines it)."""
        raise NotImplementedError(type(self).__name__)

    def stage_paths(self) -> list[Path]:
        """Everything this stage wrote (what a forced re-run removes): what its declaration says an
        instance writes (``Stage.outputs``), else its output."""
        return node_outputs(self.layout, self.stage, self.stage_params()) or [Path(self.output().path)]

    def tell_scheduler(self, percent: float | None = None, message: str | None = None) -> None:
        """Luigi's ``set_progress_percentage``/``set_status_message`` (which Luigi's worker sets on the task
        while it runs), except that a scheduler that does not answer (luigid stopped or restarting: Luigi's
        RPCError after its retries) never fails the task: a warning, once, and the work goes on."""
        try:
            if percent is not None and callable(self.set_progress_percentage):
                self.set_progress_percentage(percent)
            if message is not None and callable(self.set_status_message):
                self.set_status_message(message)
        except Exception as error:  # noqa: BLE001 - whatever the scheduler's client raises
            if not getattr(self, "_scheduler_silent", False):
                self._scheduler_silent = True
                log.warning(
                    "%s: the scheduler did not take this task's progress (%s: %s); the task goes on, "
                    "its progress is no longer shown there",
                    self.task_id,
                    type(error).__name__,
                    str(error).splitlines()[0] if str(error) else "",
                )


def _stop_on_passed_on_signal(name: str) -> None:
    """In a task's process: the stop ``deepspeech-train`` passes on (``stop_signals.PASSED_ON``) ends a
    stage other than Train with a one-line error raised where it runs, so its ``with`` blocks release its
    locks and stop its pools (by default the signal killed it at once, leaving a pool's children behind
    holding its locks)."""
    from pipeline.train.stop_signals import PASSED_ON

    def stop(number, frame):
        raise StageError(f"{name}: stopped by a signal (deepspeech-train was asked to stop); run it again")

    if threading.current_thread() is threading.main_thread():
        signal.signal(PASSED_ON, stop)


class _SchedulerMessenger:
    """Sends a task's latest progress and status message to the scheduler from a thread of its own, so
    that the work never waits for the scheduler: a luigid that stopped answering costs Luigi's client
    its retries (seconds per call), which would otherwise stall every reporting step. Only the latest
    state is sent; older ones it replaces are dropped."""

    def __init__(self, task: luigi.Task):
        self.task = task
        self._latest: tuple[float, str] | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def send(self, percent: float, message: str) -> None:
        """Queue (percent, message) to be sent, replacing what was not sent yet."""
        with self._lock:
            self._latest = (percent, message)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="scheduler-progress", daemon=True)
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                latest, self._latest, closed = self._latest, None, self._closed
            if latest is not None:
                percent, message = latest
                # A ConfigTask's tell_scheduler never raises; a plain task's setters may: the thread goes on.
                with contextlib.suppress(Exception):
                    if hasattr(self.task, "tell_scheduler"):
                        self.task.tell_scheduler(percent, message)
                    else:
                        self.task.set_progress_percentage(percent)
                        self.task.set_status_message(message)
            if closed:
                return

    def close(self, timeout_s: float = 15.0) -> None:
        """Send what is queued (waiting at most ``timeout_s``), then stop the thread."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout_s)


class Progress:
    """Reports progress to the Luigi scheduler UI (from a thread: the work never waits for the
    scheduler) and to a terminal progress bar."""

    def __init__(self, task: luigi.Task, total: int, unit: str, description: str, min_interval: float = 1.0):
        self.task = task
        self.bar = tqdm(total=total, unit=unit, desc=description, dynamic_ncols=True)
        self.min_interval = min_interval
        self._last = 0.0
        self._messenger = _SchedulerMessenger(task)

    def update(self, done: int, message: str, percent: float | None = None, force: bool = False) -> None:
        """Move the bar to ``done`` and, at most every ``min_interval`` seconds, tell the scheduler."""
        self.bar.n = done
        self.bar.set_postfix_str(message, refresh=False)
        self.bar.refresh()
        now = time.monotonic()
        if force or now - self._last >= self.min_interval:
            self._last = now
            total = self.bar.total or 1
            self._messenger.send(round(100.0 * done / total if percent is None else percent, 1), message)

    def percent(self, message: str, percent: float) -> None:
        """A stage's ``on_status(message, percent)``: a bar of 100 steps, the UI told at every status."""
        self.update(round(percent), message, percent, force=True)

    def close(self) -> None:
        """Close the terminal bar and send the last progress to the scheduler."""
        self.bar.close()
        self._messenger.close()
