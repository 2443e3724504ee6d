"""Keep TensorFlow's gRPC worker server off the network interfaces it was not asked to use.

TensorFlow binds a worker's server to the wildcard address (every interface)
whatever ``TF_CONFIG`` says, which exposes an unauthenticated service on a
shared machine. A tiny ``LD_PRELOAD`` library (``native/bind_address.c``,
compiled once with the system C compiler) redirects wildcard binds to the
worker's own address from ``TF_CONFIG``: 127.0.0.1 for ``local_workers``.
Written by hand because TensorFlow has no bind-address option and no library
provides this redirection.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import os
import platform
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from xdg import BaseDirectory

from pipeline.files import writer_tag
from pipeline.train.distribute import DistributionError

SOURCE = Path(__file__).with_name("native") / "bind_address.c"
ADDRESS_VARIABLE = "DEEPSPEECH_BIND_ADDRESS"

log = logging.getLogger(__name__)


def _elf_identity(path: str | Path) -> tuple[int, int, int] | None:
    """(class, byte order, machine) from an ELF header: what must match for the dynamic loader to load a
    library into a process; None when ``path`` is not an ELF file."""
    try:
        with open(path, "rb") as file:
            header = file.read(20)
    except OSError:
        return None
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    order = "little" if header[5] == 1 else "big"
    return header[4], header[5], int.from_bytes(header[18:20], order)


def _unusable(library: Path) -> str | None:
    """Why a cached shim must not be preloaded (None when it may): it is preloaded into every worker, so
    it must be this user's own regular file that nobody else can write, built for this machine, and
    loadable (checked in a child process, so a bad file never touches this one)."""
    try:
        info = library.lstat()
    except OSError as error:
        return f"cannot stat it ({error.strerror})"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}, not this user ({os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    own = _elf_identity(os.path.realpath(sys.executable))
    found = _elf_identity(library)
    if found is None:
        return "not an ELF library"
    if own is not None and found != own:
        return f"built for another architecture (ELF class/order/machine {found}, this Python's {own})"
    result = subprocess.run(
        [sys.executable, "-I", "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])", str(library)],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},
        timeout=60,
    )
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        return f"does not load ({lines[-1][:200] if lines else f'exit {result.returncode}'})"
    return None


def _compiler() -> list[str]:
    """The C compiler command: ``CC`` split as a shell would (``ccache gcc``), else cc or gcc."""
    configured = os.environ.get("CC", "").strip()
    if configured:
        try:
            command = shlex.split(configured)
        except ValueError as error:
            raise DistributionError(f"CC={configured!r}: cannot parse it as a command ({error})") from error
        if command:
            return command
    found = shutil.which("cc") or shutil.which("gcc")
    if not found:
        raise DistributionError(
            "multi-worker training needs a C compiler (cc or gcc) once, to build the library "
            "that keeps TensorFlow's worker server on the address of TF_CONFIG; install gcc"
        )
    return [found]


def shim_library(cache_dir: Path | None = None) -> Path:
    """The compiled shim, built on first use into the user cache, keyed by the source's digest and the
    machine's architecture. A cached file is used only when ``_unusable`` finds nothing wrong with it;
    otherwise it is rebuilt (a shared home seen from another architecture, a file another user wrote)."""
    source = SOURCE.read_bytes()
    cache_dir = Path(cache_dir or Path(BaseDirectory.xdg_cache_home) / "luigi-deepspeech")
    machine = platform.machine() or "unknown"
    library = cache_dir / f"bind_address-{hashlib.sha256(source).hexdigest()[:12]}-{machine}.so"
    if os.path.lexists(library):
        problem = _unusable(library)
        if problem is None:
            return library
        log.warning("%s: not used (%s); building it again", library, problem)
    compiler = _compiler()
    cache_dir.mkdir(parents=True, exist_ok=True)
    # A name of this build's own (host, pid and a random part, made with O_EXCL): the cache may be a home
    # directory shared by every node of a cluster, where another node's build can have this pid.
    try:
        handle, name = tempfile.mkstemp(
            prefix=f".{library.name}.{writer_tag()}.", suffix=".tmp", dir=cache_dir
        )
    except OSError as error:
        raise DistributionError(
            f"{cache_dir}: cannot write the bind-address library there ({error})"
        ) from None
    os.close(handle)
    tmp = Path(name)
    try:
        try:
            result = subprocess.run(
                [*compiler, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(SOURCE), "-ldl"],
                capture_output=True,
                text=True,
            )
        except OSError as error:
            raise DistributionError(
                f"CC={shlex.join(compiler)!r}: cannot run {compiler[0]} ({error.strerror}); set CC to an "
                f"installed C compiler or install gcc"
            ) from error
        if result.returncode != 0:
            raise DistributionError(
                f"{SOURCE}: cannot compile with {shlex.join(compiler)}: {result.stderr.strip()[:300]}"
            )
        os.chmod(tmp, 0o755)  # not group- or world-writable whatever the umask: _unusable checks it
        problem = _unusable(tmp)
        if problem is not None:
            raise DistributionError(f"{SOURCE}: the library {shlex.join(compiler)} built {problem}")
        os.replace(tmp, library)
    finally:
        tmp.unlink(missing_ok=True)
    return library


def _cluster_hosts(spec: dict) -> tuple[str, list[str]]:
    """(this task's host, the hosts of every other task) of a parsed ``TF_CONFIG``."""
    kind, index = spec["task"].get("type", "worker"), int(spec["task"].get("index", 0))
    own, others = None, []
    for job, addresses in spec["cluster"].items():
        for position, address in enumerate(addresses):
            host = address.rsplit(":", 1)[0]
            host = host[1:-1] if host.startswith("[") else host
            if (job, position) == (kind, index):
                own = host
            else:
                others.append(host)
    if own is None:
        raise KeyError(f"task {kind} {index}")
    return own, others


def own_host(tf_config: str) -> str:
    """The host part of this task's own entry in ``TF_CONFIG`` (``cluster[task.type][task.index]``)."""
    return _cluster_hosts(json.loads(tf_config))[0]


def _resolve(host: str) -> list[str]:
    """The addresses ``host`` resolves to for TCP, in the resolver's order, without repeats."""
    answers = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(answer[4][0] for answer in answers))


def is_loopback(address: str) -> bool:
    """Whether an address literal is a loopback address (127.0.0.0/8, ::1, or IPv4-mapped loopback)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def choose_address(host: str, peers: list[str], resolve: Callable[[str], list[str]] = _resolve) -> str:
    """The address this worker's server binds to: the first answer for ``host`` when every peer is on
    this machine's loopback too, else the first answer that is not loopback. A host name that resolves
    only to loopback (Debian's ``127.0.1.1 <hostname>`` line) in a cluster with peers elsewhere is
    refused: peers could not connect, and the run would hang until the collective timeout."""
    try:
        answers = resolve(host)
    except (socket.gaierror, UnicodeError) as error:
        raise DistributionError(f"TF_CONFIG: cannot resolve this worker's host {host!r} ({error})") from error
    if not answers:
        raise DistributionError(f"TF_CONFIG: this worker's host {host!r} resolves to no address")

    def beyond_loopback(peer: str) -> bool:
        try:
            return not all(is_loopback(address) for address in resolve(peer))
        except (socket.gaierror, UnicodeError, ValueError):
            return True  # unknown here: assume it is elsewhere

    remote = [peer for peer in dict.fromkeys(peers) if peer != host and beyond_loopback(peer)]
    if not remote:
        return answers[0]
    reachable = [address for address in answers if not is_loopback(address)]
    if not reachable:
        raise DistributionError(
            f"TF_CONFIG: this worker's host {host!r} resolves only to loopback ({', '.join(answers)}), but "
            f"the cluster has workers on other hosts ({', '.join(remote[:3])}) that could not connect to it; "
            f"give this worker's network address in TF_CONFIG (or fix /etc/hosts)"
        )
    return reachable[0]


def bound_environment(tf_config: str, env: dict | None = None) -> dict:
    """``env`` (default: this process's) plus what makes a worker with ``tf_config`` listen on its own
    address only: the shim preloaded and the address (``choose_address``) as a numeric literal."""
    env = dict(os.environ if env is None else env)
    if not sys.platform.startswith("linux"):
        return env
    host, peers = _cluster_hosts(json.loads(tf_config))
    address = choose_address(host, peers)
    preload = [str(shim_library())] + [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    env.update({"LD_PRELOAD": ":".join(preload), ADDRESS_VARIABLE: address, "TF_CONFIG": tf_config})
    return env


def is_bound(env: dict | None = None) -> bool:
    """Whether this process runs with the shim (so TensorFlow's server binds to its own address)."""
    env = os.environ if env is None else env
    return bool(env.get(ADDRESS_VARIABLE)) and "bind_address-" in env.get("LD_PRELOAD", "")
