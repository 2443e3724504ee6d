"""native_client.quiet: the stderr filter that keeps runtimes' set-up lines off the terminal never loses
a line it should pass."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT


def test_two_threads_filtering_stderr_at_once_lose_nothing():
    """Each model loads (and first runs) with file descriptor 2 redirected to a capture file. Two threads
    doing so at once (two models opened in a thread pool, a model collected on another thread) restored
    fd 2 out of order: the second thread put back the first one's capture file, deleted by then, and
    every later line of the process, errors included, went there (measured: ``kept b`` and the error
    written after both were lost). The second thread now waits for the first (thread B enters while A
    is inside; A waits at most 2 s for it, which it only gets when nothing serialises them)."""
    script = textwrap.dedent("""
        import os, re, threading
        from native_client.quiet import filtered_stderr

        noise = re.compile(r"^noise")
        a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

        def a():
            with filtered_stderr(noise):
                os.write(2, b"noise a\\nkept a\\n")
                a_in.set()
                b_in.wait(2)
            a_out.set()

        def b():
            a_in.wait()
            with filtered_stderr(noise):
                os.write(2, b"noise b\\nkept b\\n")
                b_in.set()
                a_out.wait()

        threads = [threading.Thread(target=a), threading.Thread(target=b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        os.write(2, b"error: written after both\\n")
    """)
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == ["kept a", "kept b", "error: written after both"], result.stderr


def test_a_line_that_is_not_noise_passes_and_its_continuation_with_it():
    """What the filter drops: a noise line and the indented (or ``└``) lines continuing it; anything
    else, an ERROR line and its continuation among them, passes in order."""
    script = textwrap.dedent("""
        import os
        from native_client.litert import LITERT_NOISE
        from native_client.quiet import filtered_stderr

        with filtered_stderr(LITERT_NOISE):
            os.write(2, b"INFO: [environment.cc:36] Creating LiteRT environment with options\\n")
            os.write(2, b"WARNING: [compiler_plugin.cc:312] Failed to load plugin: ERROR: [x.cc:1]\\n")
            os.write(2, "\\u2514 Could not load shared library\\n".encode())
            os.write(2, b"ERROR: [model_load.cc:413] Signature does not refer to a valid subgraph\\n")
            os.write(2, b"  the index was 7\\n")
            os.write(2, b"Traceback (most recent call last):\\n")
    """)
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "ERROR: [model_load.cc:413] Signature does not refer to a valid subgraph",
        "  the index was 7",
        "Traceback (most recent call last):",
    ]
