"""The dtrain package's tests run against the build tree (PYTHONPATH=<build>/python, set by
CTest) with Debian's python3."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SOURCE = Path(os.environ.get("DTRAIN_SOURCE_DIR", HERE.parents[1]))


def run_python(script, *args, timeout=180, env=None, cwd=None):
    """Runs a Python file in a fresh interpreter (bounded in time); its exit code and output."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=cwd)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture
def python_run():
    return run_python
