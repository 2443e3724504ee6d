"""Operating the pipeline as a Luigi pipeline (issue 36), on a real luigid started as `make scheduler` starts
it (``python -m tasks.scheduler``): ``--workers 2`` within ``[resources]``, the task history in SQLite, the
failure mail, and the retry rule per stage."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from pipeline.train.multiworker import free_ports
from tests import corpus_layouts
from tests.conftest import ALPHABET, ROOT

pytestmark = pytest.mark.slow


def _environment(luigi_cfg: Path) -> dict:
    return {
        **os.environ,
        "LUIGI_CONFIG_PATH": str(luigi_cfg),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }


class Luigid:
    """``python -m tasks.scheduler`` on a free port, reading ``luigi_cfg`` over the project's luigi.cfg."""

    def __init__(self, state_dir: Path, luigi_cfg: Path):
        self.state_dir, self.luigi_cfg = state_dir, luigi_cfg
        self.port = free_ports(1)[0]
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tasks.scheduler",
                "--state-dir",
                str(state_dir),
                "--port",
                str(self.port),
            ],
            cwd=ROOT,
            env=_environment(luigi_cfg),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                self.page("/history")
                return
            except OSError:
                assert self.process.poll() is None and time.monotonic() < deadline, "luigid did not start"
                time.sleep(0.3)

    def page(self, path: str) -> str:
        """The text of one page of luigid's HTTP server."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as response:
            return response.read().decode()

    def run(
        self, *args: str, timeout: float = 600, luigi_cfg: Path | None = None
    ) -> subprocess.CompletedProcess:
        """``deepspeech-train *args`` against this luigid (reading ``luigi_cfg``, default luigid's)."""
        return subprocess.run(
            [sys.executable, "-m", "tasks.cli", *args, "--scheduler-port", str(self.port)],
            cwd=ROOT,
            env=_environment(luigi_cfg or self.luigi_cfg),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def stop(self) -> None:
        """SIGTERM: luigid saves its state and exits."""
        self.process.terminate()
        self.process.wait(30)

    def history(self) -> list[tuple[str, dict, list[tuple[str, str]]]]:
        """Every task run in the history database: (name, parameters, [(event, timestamp), ...])."""
        with sqlite3.connect(self.state_dir / "history.db") as db:
            runs = []
            for task_id, name in db.execute("SELECT id, name FROM tasks ORDER BY id"):
                params = dict(
                    db.execute("SELECT name, value FROM task_parameters WHERE task_id = ?", (task_id,))
                )
                events = db.execute(
                    "SELECT event_name, ts FROM task_events WHERE task_id = ? ORDER BY id", (task_id,)
                ).fetchall()
                runs.append((name, params, events))
        return runs


@pytest.fixture
def luigid(tmp_path):
    """Start luigids with a luigi.cfg of the test's own (``settings``: its text); stopped after the test."""
    started = []

    def start(settings: str, name: str = "luigid") -> Luigid:
        luigi_cfg = tmp_path / f"{name}.cfg"
        luigi_cfg.write_text(textwrap.dedent(settings))
        started.append(Luigid(tmp_path / name, luigi_cfg))
        return started[-1]

    yield start
    for each in started:
        each.stop()


def _two_corpora_config(tmp_path: Path, name: str) -> Path:
    corpora = []
    for key in ("one", "two"):
        root = corpus_layouts.librispeech_speech(
            tmp_path / f"corpus-{key}", {"train": 24, "dev": 8, "test": 8}
        )
        corpora.append({"importer": "librispeech", "path": str(root), "name": key})
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "paths": {"work_dir": str(tmp_path / f"work-{name}"), "alphabet": str(ALPHABET)},
                "data": {"corpora": corpora},
                "features": {"workers": 1},
            }
        )
    )
    return path


def _intervals(runs, name: str) -> list[tuple[str, str]]:
    """(RUNNING, DONE) timestamps of each run of task ``name`` that finished."""
    found = []
    for task_name, _, events in runs:
        times = dict(events)
        if task_name == name and "RUNNING" in times and "DONE" in times:
            found.append((times["RUNNING"], times["DONE"]))
    return found


def _overlap(first: tuple[str, str], second: tuple[str, str]) -> bool:
    return first[0] < second[1] and second[0] < first[1]


@pytest.mark.long
@pytest.mark.parametrize("cpu", [2, 1])
def test_workers_run_independent_stages_at_once_within_the_cpu_resource(tmp_path, luigid, cpu):
    """Issue 36 (1, 3): with --workers 2 and [resources] cpu = 2, the two corpora's Imports run at once and
    so do the FeaturesSplits (each takes features.workers = 1 cpu); with cpu = 1 no two of them overlap.
    The times come from luigid's task history (SQLite beside its state file), also served at /history."""
    scheduler = luigid(f"[resources]\ncpu = {cpu}\ngpu = 1\n")
    config = _two_corpora_config(tmp_path, "two")
    result = scheduler.run("Features", "--config", str(config), "--workers", "2")
    assert result.returncode == 0, result.stderr[-3000:]

    runs = scheduler.history()
    imports, splits = _intervals(runs, "Import"), _intervals(runs, "FeaturesSplit")
    assert len(imports) == 2 and len(splits) == 3, runs
    assert sorted(params["corpus"] for name, params, _ in runs if name == "Import") == ["one", "two"]
    pairs = [(imports[0], imports[1]), (splits[0], splits[1]), (splits[0], splits[2]), (splits[1], splits[2])]
    if cpu == 2:
        assert _overlap(*pairs[0]), imports
        assert any(_overlap(*pair) for pair in pairs[1:]), splits
    else:
        assert not any(_overlap(*pair) for pair in pairs), runs
    page = scheduler.page("/history")
    assert "FeaturesSplit" in page and "Import" in page


def test_a_stage_luigid_can_never_grant_is_one_line_and_one_it_grants_less_of_runs(tmp_path, luigid):
    """Issue 42 G11: the tasks capped their resources at this machine's luigi.cfg, not at luigid's: against a
    luigid with a smaller [resources] a stage asked more than it ever grants and the command waited for
    ever. Now the cap is luigid's own (asked over its RPC): FeaturesSplit with features.workers 2 runs on a
    luigid granting cpu 1; and a stage luigid can never grant (cpu 0) is one line naming the stage, the
    resource, what it asks and what luigid grants, exit 2, before anything runs. Each run is bounded."""
    client = tmp_path / "client.cfg"
    client.write_text("[resources]\ncpu = 4\ngpu = 1\n")  # this machine's: more than luigid grants
    work = tmp_path / "work"
    config = tmp_path / "c.yaml"
    config.write_text(
        f"extends: {ROOT / 'configs' / 'sample.yaml'}\npaths:\n  work_dir: {work}\n"
        "data:\n  limit_dev: 3\nfeatures:\n  workers: 2\n"
    )
    command = ("FeaturesSplit", "--split", "dev", "--config", str(config))

    never = luigid("[resources]\ncpu = 0\n", name="never")
    refused = never.run(*command, luigi_cfg=client, timeout=120)
    assert refused.returncode == 2, refused.stderr[-3000:]
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        f"error: FeaturesSplit asks cpu 1 and the scheduler at 127.0.0.1:{never.port} grants cpu 0"
    ), refused.stderr[-3000:]
    assert not work.exists()

    one = luigid("[resources]\ncpu = 1\n", name="one")
    done = one.run(*command, luigi_cfg=client, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [name for name, _, events in one.history() if ("DONE" in dict(events))] == ["FeaturesSplit"]


@pytest.mark.long
def test_a_non_finite_stop_is_not_retried_and_stays_a_stop_until_the_limit_is_raised(small_config, tmp_path):
    """Issue 42 G7: training.max_nonfinite_batches stopped Train with a TrainingError that Luigi retried (six
    times, 30 s apart): the retry resumed from the checkpoint saved past the bad streak, its count at 0, and
    training went on. Here every update would make the weights non-finite (learning rate 1e39), 2 in a row
    stop: `deepspeech-train Train --local-scheduler` runs Train once (a retry would come 1 s after the
    failure); the same command again stops at once with the same line, training nothing; with the limit
    raised to 3 (no fingerprint moves: the same run) training goes on from that checkpoint and stops at the
    third skipped update after it."""
    settings = tmp_path / "retry.cfg"
    settings.write_text("[scheduler]\nretry_delay = 1\n")
    nan = (
        "training:\n  epochs: 2\n  learning_rate: 1.0e+39\n  validation_epochs: 0\n  max_nonfinite_batches: "
    )
    two, three = small_config("two.yaml", extra=nan + "2\n"), small_config("three.yaml", extra=nan + "3\n")

    def train(path: Path) -> tuple[subprocess.CompletedProcess, list[str], str]:
        result = subprocess.run(
            [sys.executable, "-m", "tasks.cli", "Train", "--config", str(path), "--local-scheduler"],
            cwd=ROOT,
            env=_environment(settings),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 30, result.stderr[-3000:]
        attempts = [line for line in result.stderr.splitlines() if " running   Train(" in line]
        errors = [line for line in result.stderr.splitlines() if line.startswith("TrainingError: ")]
        assert len(errors) == 1, result.stderr[-3000:]
        return result, attempts, errors[0].split(" (traceback in ")[0]

    first, attempts, stop = train(two)
    assert len(attempts) == 1, first.stderr[-3000:]
    assert stop.startswith("TrainingError: 2 batches in a row had a non-finite loss"), stop
    assert "stays stopped at step 2: raise training.max_nonfinite_batches above 2" in stop, stop

    again, attempts, same = train(two)
    assert len(attempts) == 1 and same == stop, again.stderr[-3000:]
    assert "Training to epoch" not in again.stderr and "Restored " not in again.stderr

    raised, attempts, later = train(three)
    assert len(attempts) == 1, raised.stderr[-3000:]
    assert "above the 2 that stopped this run at step 2: training goes on" in raised.stderr
    assert ", step 2 (2 of this epoch)" in raised.stderr  # restored where the first run stopped
    assert later.startswith("TrainingError: 3 batches in a row") and "stopped at step 5" in later, later


class MailSink:
    """An SMTP server on 127.0.0.1 (aiosmtpd) keeping every message it receives."""

    def __init__(self):
        from aiosmtpd.controller import Controller

        self.messages = []
        self.port = free_ports(1)[0]
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port)
        self.controller.start()

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's handler name
        """Keep the message."""
        import email

        self.messages.append(email.message_from_bytes(envelope.content))
        return "250 OK"

    def stop(self) -> None:
        """Stop the server."""
        self.controller.stop()


@pytest.fixture
def mail_sink():
    """A local SMTP sink; yields it, stopped after the test."""
    sink = MailSink()
    yield sink
    sink.stop()


def _mail_settings(port: int) -> str:
    return f"""
        [scheduler]
        retry_delay = 1
        [email]
        receiver = lab@example.org
        sender = deepspeech@example.org
        method = smtp
        force_send = true
        [smtp]
        host = 127.0.0.1
        port = {port}
    """


def _body(message) -> str:
    return (
        message.get_payload(decode=True).decode()
        if not message.is_multipart()
        else str(message.get_payload(0).get_payload(decode=True).decode())
    )


def test_a_damaged_output_fails_once_with_one_mail_and_is_not_retried(small_config, luigid, mail_sink):
    """Issue 36 (2, 4): Train finds its report damaged: the task fails with the project's one line, Luigi's
    worker sends one failure mail whose body holds that line, the run's log file and the commands
    that go on, and the scheduler disables the task at once (retry_count 1 for a config or data error;
    with retry_delay 1 s, a retry would have come before the run ended); the history has one failure."""
    from pipeline.config_loader import load_config
    from pipeline.layout import Layout

    path = small_config()
    report = Layout(load_config(path)).train_run.report
    report.parent.mkdir(parents=True)
    report.write_text("{not json")
    scheduler = luigid(_mail_settings(mail_sink.port))
    result = scheduler.run("Train", "--config", str(path))
    assert result.returncode == 30, result.stderr[-3000:]

    # One failure mail from the worker; luigid (reading the same [email]) adds its note that it disabled
    # the task.
    subjects = [m["Subject"] for m in mail_sink.messages]
    failed = [m for m in mail_sink.messages if "FAILED" in m["Subject"]]
    assert len(failed) == 1 and len(subjects) == 2, subjects
    assert any(s.startswith("Luigi Scheduler: DISABLED Train_") for s in subjects), subjects
    message = failed[0]
    assert message["Subject"].startswith("Luigi: Train(") and "FAILED" in message["Subject"]
    assert message["To"] == "lab@example.org"
    body = _body(message)
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if line.startswith("StageError: "))
    assert str(report) in lines[start], lines[start]
    log_line = lines[start + 1]
    assert log_line.startswith("log: ") and Path(log_line[5:]).is_file(), log_line
    assert lines[start + 2] == f"go on: deepspeech-train Train --config {path}"
    assert lines[start + 3] == f"start the stage over: make rerun STAGE=Train CONFIG={path}"
    assert lines[start + 4].startswith("retry: not retried")

    failures = [
        [event for event, _ in events if event == "FAILED"]
        for name, _, events in scheduler.history()
        if name == "Train"
    ]
    assert failures == [["FAILED"]], scheduler.history()
    disabled = scheduler.page('/api/task_list?data={"status":"DISABLED","upstream_status":"","search":""}')
    assert "Train(" in disabled


def test_a_config_error_fails_once_and_the_fixed_command_runs_it(small_config, luigid, tmp_path):
    """Issue 36 review (6): a config error disables the task at once (not retried); luigid would then ignore
    the same command for disable_persist (a day). After the config is fixed, the same command re-enables
    the disabled task of its DAG, says so in one line, and runs it."""
    bad = tmp_path / "bad.csv"
    bad.write_text("path,words\nnowhere.wav,hello\n")  # no wav_filename/transcript columns
    path = small_config(extra=f"data:\n  dev_files: [{bad}]\n")
    scheduler = luigid("[scheduler]\nretry_delay = 1\n")
    failed = scheduler.run("FeaturesSplit", "--split", "dev", "--config", str(path))
    assert failed.returncode == 30, failed.stderr[-3000:]
    disabled = scheduler.page('/api/task_list?data={"status":"DISABLED","upstream_status":"","search":""}')
    assert "FeaturesSplit(" in disabled

    path.write_text(path.read_text().replace(str(bad), str(ROOT / "data" / "sample" / "dev.csv")))
    fixed = scheduler.run("FeaturesSplit", "--split", "dev", "--config", str(path))
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    notes = [line for line in fixed.stderr.splitlines() if line.startswith("note: re-enabled 1 task(s)")]
    assert len(notes) == 1 and "FeaturesSplit_" in notes[0], fixed.stderr[-3000:]
    runs = [[e for e, _ in events] for name, _, events in scheduler.history() if name == "FeaturesSplit"]
    assert [e for run in runs for e in run if e in ("FAILED", "DONE")] == ["FAILED", "DONE"], runs


def test_a_final_error_in_the_task_process_reaches_the_worker(tmp_path):
    """The mark ``note_failure`` leaves in a forked task process (as Luigi runs each task) is what the
    worker's copy of the task reads: a config error makes retry_count 1, any other failure leaves
    Train's policy."""
    import multiprocessing

    from pipeline.config import ConfigError
    from tasks import Train
    from tasks.retries import TRAIN, note_failure, retry_policy

    config = tmp_path / "c.yaml"
    config.write_text(f"paths:\n  work_dir: {tmp_path / 'work'}\n")
    for error, expected in ((RuntimeError("lost a worker"), TRAIN.failures), (ConfigError("x: bad"), 1)):
        task = Train(config=str(config))
        task._final_error = False
        child = multiprocessing.get_context("fork").Process(target=note_failure, args=(task, error))
        child.start()
        child.join()
        assert child.exitcode == 0
        assert retry_policy(task).failures == expected, error


def test_the_final_error_mark_is_under_the_work_dir_per_worker_process_and_never_raises(tmp_path):
    """The mark is a file of the run's work directory (not a folder in /tmp another user may own), named by
    the worker's pid and start time: a mark an earlier process with the same pid left is not read; and a
    mark that cannot be written never turns into an error inside on_failure (its text would be lost)."""
    import multiprocessing

    from pipeline.config import ConfigError
    from tasks import Train
    from tasks.retries import _mark, failed_for_good, note_failure, process_start

    work = tmp_path / "work"
    config = tmp_path / "c.yaml"
    config.write_text(f"paths:\n  work_dir: {work}\n")
    task = Train(config=str(config))
    mark = _mark(task, os.getpid())
    assert mark.is_relative_to(work / "logs") and process_start(os.getpid()) in mark.name
    assert process_start(os.getpid()) != "0"

    # An earlier worker with this pid (another start time) left a mark: not this worker's.
    stale = mark.with_name(mark.name.replace(f"-{process_start(os.getpid())}-", "-1-"))
    stale.parent.mkdir(parents=True)
    stale.touch()
    assert not failed_for_good(Train(config=str(config)))

    # The logs folder cannot be made (a file is in its way): the task process still ends normally.
    blocked = tmp_path / "blocked.yaml"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "logs").write_text("not a folder")
    blocked.write_text(f"paths:\n  work_dir: {tmp_path / 'other'}\n")
    child = multiprocessing.get_context("fork").Process(
        target=note_failure, args=(Train(config=str(blocked)), ConfigError("x: bad"))
    )
    child.start()
    child.join()
    assert child.exitcode == 0


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.long
def test_a_killed_train_process_is_retried_and_resumes(small_config, luigid, tmp_path):
    """Issue 36 (4): the Train task's process killed (SIGKILL, as a lost node or the OOM killer would) while
    paused after step 12 (tests/plugins/step_barrier.py), its last checkpoint the one of step 8: Luigi's
    worker reports it failed, luigid sets it back to PENDING after retry_delay, the same `deepspeech-train`
    run (keep_alive) runs it again, and it resumes from step 8 to the end; the history has one failure and
    then the finished run. The command's output goes to files (a pipe nobody reads would block it)."""
    from pipeline.config_loader import load_config
    from pipeline.layout import Layout
    from tests.plugins.step_barrier import StepBarrier

    barrier = StepBarrier(tmp_path / "barrier", 12)
    path = small_config(
        limit_train=32,
        extra="training:\n  epochs: 6\n  checkpoint_steps: 8\n" + barrier.config_yaml(),
    )
    run_dir = Layout(load_config(path)).train_run
    scheduler = luigid("[scheduler]\nretry_delay = 1\n")
    out, err = tmp_path / "command.out", tmp_path / "command.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        command = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tasks.cli",
                "Train",
                "--config",
                str(path),
                "--scheduler-port",
                str(scheduler.port),
            ],
            cwd=ROOT,
            env=barrier.env(_environment(scheduler.luigi_cfg)),
            stdout=stdout,
            stderr=stderr,
        )
    try:
        paused = barrier.wait(12, lambda: command.poll() is None or err.read_text()[-3000:])
        assert sorted(p.name for p in run_dir.checkpoints.glob("ckpt-*.index")) == ["ckpt-8.index"]
        # The Train task's process: Luigi's fork of the command (the same command line), paused at step 12.
        task_processes = [pid for pid in _children(command.pid) if _cmdline(pid) == _cmdline(command.pid)]
        assert task_processes == list(paused), (task_processes, paused)
        os.kill(task_processes[0], 9)
        barrier.release(12)  # the retry passes step 12 again
        command.wait(timeout=900)
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
    stderr_text = err.read_text()
    assert command.returncode == 0, stderr_text[-3000:]
    report = yaml.safe_load(run_dir.report.read_text())
    assert report["epochs_completed"] == 6 and report["global_step"] == 6 * 8
    events = [
        [event for event, _ in e if event in ("FAILED", "DONE")]
        for n, _, e in scheduler.history()
        if n == "Train"
    ]
    assert [event for run in events for event in run] == ["FAILED", "DONE"], scheduler.history()
    log_file = next(
        line.split(": ", 1)[1] for line in stderr_text.splitlines() if line.startswith("log of this run: ")
    )
    assert "Restored " in Path(log_file).read_text() and ", step 8 (" in Path(log_file).read_text()
