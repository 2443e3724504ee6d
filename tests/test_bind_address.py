"""The bind-address shim of multi-worker training (issue 26 M6): which address a worker binds to, how the C
compiler is run, and which cached library may be preloaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from pipeline.train.bind_address import (
    ADDRESS_VARIABLE,
    _elf_identity,
    bound_environment,
    choose_address,
    shim_library,
)
from pipeline.train.distribute import DistributionError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the shim is Linux only")


def _tf_config(hosts: list[str], index: int) -> str:
    workers = [f"{host}:{2000 + i}" for i, host in enumerate(hosts)]
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def test_a_loopback_only_host_is_refused_in_a_cluster_with_other_hosts(tmp_path, monkeypatch):
    """'localhost' answers only loopback: bound there, the worker on 10.255.255.1 could never connect."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(DistributionError) as error:
        bound_environment(_tf_config(["localhost", "10.255.255.1"], 0), {})
    message = str(error.value)
    assert (
        "\n" not in message
        and "'localhost' resolves only to loopback" in message
        and "10.255.255.1" in message
    )


def test_a_cluster_on_this_machine_keeps_the_loopback_address(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for hosts in (["127.0.0.1", "127.0.0.1"], ["localhost", "127.0.0.1"], ["localhost", "localhost"]):
        env = bound_environment(_tf_config(hosts, 0), {})
        assert env[ADDRESS_VARIABLE] in ("127.0.0.1", "::1"), (hosts, env[ADDRESS_VARIABLE])


def test_the_reachable_answer_is_preferred_to_loopback():
    """A name answering 127.0.1.1 first and its network address second binds to the network address when
    peers are elsewhere (answers given by a table: the machine's resolver has no such name)."""
    table = {"me": ["127.0.1.1", "192.0.2.10"], "peer": ["192.0.2.11"], "twin": ["127.0.1.1"]}
    assert choose_address("me", ["peer"], table.__getitem__) == "192.0.2.10"
    assert choose_address("me", ["twin"], table.__getitem__) == "127.0.1.1"  # every peer on this machine
    assert choose_address("me", ["me"], table.__getitem__) == "127.0.1.1"


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_cc_is_split_like_a_shell_command(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "gcc -Wall")  # as CC="ccache gcc" is written
    library = shim_library(tmp_path)
    assert library.is_file() and _elf_identity(library) == _elf_identity(os.path.realpath(sys.executable))
    monkeypatch.setenv("CC", "no-such-compiler -O2")
    with pytest.raises(DistributionError, match=r"cannot run no-such-compiler") as error:
        shim_library(tmp_path / "other")
    assert "\n" not in str(error.value)


def _loads(library) -> bool:
    code = "import ctypes, sys; ctypes.CDLL(sys.argv[1])"
    return subprocess.run([sys.executable, "-c", code, str(library)], capture_output=True).returncode == 0


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler")
def test_a_cached_library_is_checked_before_it_is_preloaded(tmp_path, caplog):
    good = shim_library(tmp_path)
    original = good.read_bytes()

    def damaged(how) -> None:
        how(good)
        with caplog.at_level("WARNING"):
            again = shim_library(tmp_path)
        assert again == good and good.read_bytes() == original and _loads(good), caplog.text
        assert good.stat().st_uid == os.getuid() and not good.stat().st_mode & 0o022
        assert "building it again" in caplog.text
        caplog.clear()

    damaged(lambda path: path.write_bytes(b"not a library"))

    def other_architecture(path):
        data = bytearray(path.read_bytes())
        machine = int.from_bytes(data[18:20], "little")
        data[18:20] = (183 if machine != 183 else 62).to_bytes(2, "little")  # aarch64, or x86-64 on one
        path.write_bytes(bytes(data))

    damaged(other_architecture)
    damaged(lambda path: path.chmod(0o777))
    if os.getuid() == 0:
        damaged(lambda path: os.chown(path, 65534, 65534))

    def truncated(path):
        path.write_bytes(path.read_bytes()[:64])  # an ELF header that the loader cannot map

    damaged(truncated)


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler")
def test_a_build_never_touches_another_nodes_build_in_a_shared_cache(tmp_path):
    """Issue 42 G12: the shim was compiled into ``.<library>.<pid>.tmp`` of the cache directory, which a home
    directory shared by a cluster's nodes holds once for all: another node's build with the same pid (as
    containers start at low pids) wrote the same file, and each moved or deleted the other's. Here the
    other node's build is a file of that name, left as it was; the library is built beside it, and this
    build leaves no file of its own behind."""
    import hashlib
    import platform

    from pipeline.train.bind_address import SOURCE

    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    library = tmp_path / f"bind_address-{digest}-{platform.machine() or 'unknown'}.so"
    other_node = tmp_path / f".{library.name}.{os.getpid()}.tmp"
    other_node.write_bytes(b"another node's build in progress")
    assert shim_library(tmp_path) == library and _loads(library)
    assert other_node.read_bytes() == b"another node's build in progress"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([library.name, other_node.name])
