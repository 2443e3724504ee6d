"""pipeline/files.py and pipeline/locks.py: durable atomic writes, publishing entries, leftovers of killed
runs told apart from live writers on other machines (issue 26 L1, L4)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pipeline.files import atomic_path, remove_leftovers, write_json_atomic
from pipeline.locks import stage_lock
from pipeline.workdir import LEFTOVER_PATTERNS
from tests.conftest import ROOT


class _SyncLog:
    """Records, in order, every fsync (with the inode it synced) and every rename of the real calls."""

    def __init__(self, monkeypatch):
        self.events = []
        real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

        def fsync(fd):
            self.events.append(("fsync", os.fstat(fd).st_ino))
            real_fsync(fd)

        def replace(src, dst, **kwargs):
            self.events.append(("rename", os.stat(src).st_ino, Path(dst)))
            real_replace(src, dst, **kwargs)

        def rename(src, dst, **kwargs):
            self.events.append(("rename", os.stat(src).st_ino, Path(dst)))
            real_rename(src, dst, **kwargs)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "rename", rename)

    def check_durable(self, final: Path) -> None:
        """``final``'s data was synced before the rename that named it, and its folder after."""
        renames = [i for i, e in enumerate(self.events) if e[0] == "rename" and e[2] == final]
        assert renames, f"{final} was never renamed into place: {self.events}"
        at = renames[-1]
        inode = os.stat(final).st_ino
        assert ("fsync", inode) in self.events[:at], f"{final} not synced before its rename"
        assert ("fsync", os.stat(final.parent).st_ino) in self.events[at:], f"{final.parent} not synced"


def test_atomic_writes_reach_the_disk_before_their_rename(tmp_path, monkeypatch):
    """Issue 26 L4: atomic writes never called fsync, so after a power loss a report, cache or part
    could be empty under its final name (the rename reached the disk, the data did not). Reports, the
    feature cache and a published export directory are synced before the rename, their folder after."""
    from pipeline.config import FeaturesConfig
    from pipeline.features.cache import CacheWriter

    log = _SyncLog(monkeypatch)
    report = tmp_path / "reports" / "train_report.json"
    write_json_atomic(report, {"epochs": 3})
    log.check_durable(report)

    cache = tmp_path / "features" / "train.h5"
    lengths = np.array([3, 2])
    labels, texts, paths = [[1], [2]], ["a", "b"], ["x", "y"]
    with CacheWriter(cache, "f", FeaturesConfig(), lengths, labels, texts, paths, [0.1, 0.1]) as w:
        w.put(0, np.zeros((3, 26), np.float32))
        w.put(1, np.ones((2, 26), np.float32))
    log.check_durable(cache)

    from pipeline.files import publish_entries

    staging, destination = tmp_path / "export" / ".staging-x", tmp_path / "export"
    (staging / "saved_model").mkdir(parents=True)
    (staging / "saved_model" / "model.pb").write_bytes(b"graph")
    (staging / "metadata.json").write_text("{}")
    publish_entries(staging, destination, last=("metadata.json",))
    log.check_durable(destination / "metadata.json")
    assert ("fsync", os.stat(destination / "saved_model" / "model.pb").st_ino) in log.events


def test_publishing_touches_only_the_entries_it_publishes(tmp_path):
    """Issue 26 H2/N7: publishing moves each staged entry into place in one step (exchanging it with the
    old one); other files of the directory stay, entries the new set drops are removed only when named as
    replaced, and the directory itself is never renamed (it may be a mount point)."""
    from pipeline.files import publish_entries

    destination = tmp_path / "export"
    (destination / "2").mkdir(parents=True)
    (destination / "notes.txt").write_text("mine")
    (destination / "lm.arpa").write_text("old lm")
    (destination / "model.tflite").write_text("old model")
    inode = os.stat(destination).st_ino
    staging = destination / ".staging-x"
    staging.mkdir()
    (staging / "model.tflite").write_text("new model")
    (staging / "metadata.json").write_text("{}")
    publish_entries(staging, destination, last=("metadata.json",), replaced=["model.tflite", "lm.arpa"])
    assert os.stat(destination).st_ino == inode
    names = sorted(p.name for p in destination.iterdir())
    assert names == [".staging-x", "2", "metadata.json", "model.tflite", "notes.txt"]
    assert (destination / "model.tflite").read_text() == "new model"
    assert [p.read_text() for p in staging.iterdir()] == ["old model"]  # exchanged out, to be removed


_OTHER_HOST_WRITER = textwrap.dedent("""
    import os, socket, sys, time
    socket.sethostname("otherhost")
    target = int(sys.argv[2])
    while True:  # in a new pid namespace: fork until a child has the wanted pid, which writes
        child = os.fork()
        if child == 0:
            if os.getpid() != target:
                os._exit(0)
            break
        os.waitpid(child, 0)
        if child >= target:
            sys.exit(0)
    from pipeline.files import atomic_path
    with atomic_path(sys.argv[1]) as tmp:
        tmp.write_text("half")
        print(tmp, flush=True)
        time.sleep(60)
""")


def _free_pid() -> int:
    """A small process id no process of this pid namespace has (a live writer elsewhere looks like this)."""
    used = {int(p) for p in os.listdir("/proc") if p.isdigit()}
    return next(pid for pid in range(3, 200) if pid not in used)


def test_a_live_writer_on_another_host_keeps_its_temporary_file(tmp_path):
    """Issue 26 L1: leftovers were told dead by a local ``kill(pid, 0)``: on a work directory shared by
    several machines, one host removed another's live temporary files. Here the other host is a process
    in its own UTS and pid namespaces (another host name, a process id that does not exist here) in the
    middle of an atomic write; removing leftovers beside it leaves its file alone. A dead writer of this
    host, and any leftover under a lock the caller holds, are still removed."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare")
    target = _free_pid()
    writer = subprocess.Popen(
        [
            "unshare",
            "--uts",
            "--pid",
            "--fork",
            sys.executable,
            "-c",
            _OTHER_HOST_WRITER,
            str(tmp_path / "dev.h5"),
            str(target),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        line = writer.stdout.readline().strip()
        if not line:
            pytest.skip(f"cannot make namespaces here: {writer.stderr.read()[-500:]}")
        live = Path(line)
        assert live.exists() and str(target) in live.name
        dead_here = tmp_path / f".train.h5.{_dead_tag()}.tmp"
        dead_here.write_text("x")
        removed = remove_leftovers(tmp_path, LEFTOVER_PATTERNS)
        assert live.exists(), "another host's live temporary file was removed"
        assert removed == [dead_here]
        # The caller holding the lock of dev.h5 knows its writers are gone, wherever they ran.
        assert remove_leftovers(tmp_path, LEFTOVER_PATTERNS, locked_prefixes=(".dev.h5.",)) == [live]
    finally:
        writer.kill()
        writer.wait()


def _dead_tag() -> str:
    """The tag of a dead writer of this host, as this version of atomic_path names temporaries."""
    process = subprocess.Popen(["true"])
    process.wait()
    try:
        from pipeline.files import host_name
    except ImportError:  # names without a host (before issue 26 L1)
        return str(process.pid)
    return f"{host_name()}-{process.pid}"


def test_an_output_a_live_process_holds_is_in_use(tmp_path):
    """The lock a live stage holds tells rerun that its output is in use (beside or inside it)."""
    from pipeline.locks import in_use

    output = tmp_path / "train" / "abc"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom pipeline.locks import stage_lock\n"
            f"with stage_lock({str(output)!r}):\n    print('held', flush=True)\n    time.sleep(60)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert in_use(output) == Path(f"{output}.lock")
    finally:
        holder.kill()
        holder.wait()
    assert in_use(output) is None
    output.mkdir(parents=True)
    with stage_lock(output, inside=True):
        assert in_use(output) == output / ".lock"  # flock is per open file: held even from this process
    with atomic_path(output / "x.json") as tmp:
        tmp.write_text("{}")
    assert (output / "x.json").read_text() == "{}"
