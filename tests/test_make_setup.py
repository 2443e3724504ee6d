"""``make setup`` on a Python without ensurepip (Debian without python3.X-venv): ``python -m venv`` leaves
a venv holding bin/python but no pip; make must not take it for a venv on the next run."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_setup_without_ensurepip_says_what_is_missing_and_leaves_no_half_venv(tmp_path):
    venv = tmp_path / "venv"
    python = tmp_path / "python3"
    # What Debian's python3.11 does without python3.11-venv: the venv's bin/python is made, then it fails.
    python.write_text(
        "#!/bin/bash\n"
        'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && ln -s ' + sys.executable + ' "$3/bin/python"\n'
        '  echo "The virtual environment was not created successfully because ensurepip is not available."\n'
        "  exit 1; fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    for _ in range(2):  # the second run meets what the first left behind
        result = subprocess.run(
            ["make", "--no-print-directory", "setup", f"VENV={venv}", f"PYTHON={python}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode != 0
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        errors = [line for line in result.stdout.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"install python{version}-venv" in errors[0], (
            result.stdout + result.stderr
        )
        assert "pip: No such file" not in result.stdout + result.stderr
        assert not venv.exists()
