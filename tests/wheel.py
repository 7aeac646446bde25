"""Building schedkit's wheel from a clean copy of the source tree, and installing it in a
fresh virtual environment, for tests of what a user of the package gets."""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class WheelBuild:
    """A wheel being built, in a process of its own, from a clean copy of the source tree (no
    stale build/ directory) into ``where``."""

    def __init__(self, where: Path) -> None:
        self.where = where
        source = where / "src"
        shutil.copytree(
            ROOT,
            source,
            symlinks=True,
            ignore=shutil.ignore_patterns(
                ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"
            ),
        )
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                str(source),
                "--no-deps",
                "-q",
                "-w",
                str(where),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def wait(self) -> Path:
        """The built wheel, once the build has finished."""
        stdout, stderr = self._process.communicate()
        if self._process.returncode:
            raise subprocess.CalledProcessError(
                self._process.returncode, self._process.args, stdout, stderr
            )
        (built,) = self.where.glob("schedkit-*.whl")
        return built

    def cancel(self) -> None:
        """Stop the build if it is still running."""
        if self._process.poll() is None:
            self._process.kill()
        self._process.communicate()


def build_wheel(where: Path) -> Path:
    """A wheel built from a clean copy of the source tree (no stale build/ directory)."""
    return WheelBuild(where).wait()


def install_wheel(wheel: Path, venv: Path) -> Path:
    """A virtual environment at ``venv`` with ``wheel`` installed; its dependencies come from
    this environment's site-packages, added as a plain path (their .pth files, this checkout's
    editable install among them, are not run)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv
