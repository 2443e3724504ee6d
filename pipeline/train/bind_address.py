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
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from xdg import BaseDirectory

from pipeline.train.distribute import DistributionError

SOURCE = Path(__file__).with_name("native") / "bind_address.c"
ADDRESS_VARIABLE = "DEEPSPEECH_BIND_ADDRESS"


def shim_library(cache_dir: Path | None = None) -> Path:
    """The compiled shim (built on first use into the user cache, keyed by the source's digest)."""
    source = SOURCE.read_bytes()
    cache_dir = Path(cache_dir or Path(BaseDirectory.xdg_cache_home) / "luigi-deepspeech")
    library = cache_dir / f"bind_address-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if library.is_file():
        return library
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise DistributionError(
            "multi-worker training needs a C compiler (cc or gcc) once, to build the library "
            "that keeps TensorFlow's worker server on the address of TF_CONFIG; install gcc"
        )
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = library.with_name(f".{library.name}.{os.getpid()}.tmp")
    try:
        result = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(SOURCE), "-ldl"],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise DistributionError(
                f"{SOURCE}: cannot compile with {compiler}: {result.stderr.strip()[:300]}"
            )
        os.replace(tmp, library)
    finally:
        tmp.unlink(missing_ok=True)
    return library


def own_host(tf_config: str) -> str:
    """The host part of this worker's own entry in ``TF_CONFIG`` (``cluster.worker[task.index]``)."""
    spec = json.loads(tf_config)
    address = spec["cluster"][spec["task"].get("type", "worker")][int(spec["task"].get("index", 0))]
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") else host


def bound_environment(tf_config: str, env: dict | None = None) -> dict:
    """``env`` (default: this process's) plus what makes a worker with ``tf_config`` listen on its own
    address only: the shim preloaded and the address as a numeric literal."""
    env = dict(os.environ if env is None else env)
    if not sys.platform.startswith("linux"):
        return env
    host = own_host(tf_config)
    try:
        address = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0]
    except socket.gaierror as error:
        raise DistributionError(f"TF_CONFIG: cannot resolve this worker's host {host!r} ({error})") from error
    preload = [str(shim_library())] + [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    env.update({"LD_PRELOAD": ":".join(preload), ADDRESS_VARIABLE: address, "TF_CONFIG": tf_config})
    return env


def is_bound(env: dict | None = None) -> bool:
    """Whether this process runs with the shim (so TensorFlow's server binds to its own address)."""
    env = os.environ if env is None else env
    return bool(env.get(ADDRESS_VARIABLE)) and "bind_address-" in env.get("LD_PRELOAD", "")
