"""The text of a failed task, for Luigi's failure mail and the scheduler's error view.

Luigi's worker puts what ``Task.on_failure`` returns into the failure mail it
sends (luigi.cfg's ``[email]``) and shows it in luigid's UI. ``ConfigTask`` returns
``failure_text``: the project's one-line error first, the log file of the run,
the command that goes on from where the stage stopped and the ``make rerun`` that
starts it over, whether it will be retried, then Luigi's traceback.
"""

from __future__ import annotations

import os
import shlex

from tasks.retries import is_final, retry_policy


def error_line(error: BaseException) -> str:
    """The one-line error: ``Type: first line of the message``."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def _params(task) -> list[str]:
    return [
        f"--{name.replace('_', '-')} {shlex.quote(str(value))}" for name, value in task.stage_params().items()
    ]


def go_on_command(task) -> str:
    """The command that runs the stage again from where it stopped (Train resumes from its checkpoint)."""
    words = ["deepspeech-train", task.task_family, "--config", shlex.quote(str(task.config)), *_params(task)]
    return " ".join(words)


def rerun_command(task) -> str:
    """``make rerun`` for the stage: removes its outputs and its dependents', then runs the DAG."""
    words = ["make", "rerun", f"STAGE={task.task_family}", f"CONFIG={shlex.quote(str(task.config))}"]
    params = [p for p in _params(task) if not p.startswith("--audio ")]
    audio = task.stage_params().get("audio")
    if audio:
        words.append(f"CLIP={shlex.quote(str(audio))}")
    if params:
        words.append(f"RERUN_ARGS={shlex.quote(' '.join(params))}")
    return " ".join(words)


def failure_text(task, error: BaseException, traceback_text: str = "") -> str:
    """What a failed task reports (see the module's docstring)."""
    log_file = os.environ.get("DEEPSPEECH_LOG_FILE") or "the output of the luigi command (no log file)"
    if is_final(error):
        retry = (
            "not retried: a config, data or training error a retry would repeat (the scheduler disabled the "
            "task); fix what it names, then "
            "run the go-on command (deepspeech-train re-enables the task; with `luigi --module tasks`, "
            "re-enable it in luigid's UI first, or pass --local-scheduler)"
        )
    else:
        policy = retry_policy(task)
        retry = (
            f"retried by the scheduler after its retry_delay, until {policy.failures} failures within "
            f"{policy.window_s} s"
        )
    lines = [
        error_line(error),
        f"log: {log_file}",
        f"go on: {go_on_command(task)}",
        f"start the stage over: {rerun_command(task)}",
        f"retry: {retry}",
    ]
    return "\n".join(lines) + ("\n\n" + traceback_text if traceback_text else "")
