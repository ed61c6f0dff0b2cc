"""python3 -m dtrain: the dtrain command (fit, evaluate, launch, doctor, ...)."""
import os
import shutil
import sys
from pathlib import Path


def _command():
    explicit = os.environ.get("DTRAIN_COMMAND")
    if explicit:
        return explicit
    try:
        from ._command import COMMAND  # the build tree's

        if os.access(COMMAND, os.X_OK):
            return COMMAND
    except ImportError:
        pass
    # Installed: <prefix>/lib/pythonX.Y/dist-packages/dtrain, beside <prefix>/bin/dtrain.
    installed = Path(__file__).resolve().parents[4] / "bin" / "dtrain"
    if os.access(installed, os.X_OK):
        return str(installed)
    found = shutil.which("dtrain")
    if found:
        return found
    sys.exit("python3 -m dtrain: the dtrain command was not found (set DTRAIN_COMMAND to its path)")


def main():
    command = _command()
    os.execv(command, [command, *sys.argv[1:]])


if __name__ == "__main__":
    main()
