"""Building schedkit's wheel from a clean copy of the source tree, and installing it in a
fresh virtual environment, for tests of what a user of the package gets."""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class WheelBuild:
    """A wheel being built, in a process of its own, from a clean copy of the source tree (no
    stale build/ directory) into ``where``."""

    def __init__(self, where: Path, publish: Path | None = None) -> None:
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
        command = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q"]
        command += ["-w", str(where)]
        if publish is not None:  # for other processes: see published()
            command = [sys.executable, "-m", "tests.wheel", str(publish), *command]
        self._process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
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

    def join(self) -> None:
        """Wait for the build to end, however it ends."""
        self._process.communicate()

    def cancel(self) -> None:
        """Stop the build if it is still running."""
        if self._process.poll() is None:
            self._process.kill()
        self._process.communicate()


def published(publish: Path, timeout: float = 600.0) -> Path:
    """The wheel of a build started with ``publish`` (by this process or another), once its
    directory has been renamed ``publish``."""
    failed = publish.with_name(publish.name + ".failed")
    deadline = time.monotonic() + timeout
    while not publish.is_dir():
        if failed.exists():
            raise RuntimeError(f"building the wheel failed:\n{failed.read_text()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no wheel at {publish} after {timeout:.0f} s")
        time.sleep(0.05)
    (built,) = publish.glob("schedkit-*.whl")
    return built


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


def _build_and_publish(publish: Path, command: list[str]) -> int:
    """Run the build ``command`` (its last argument, the directory the wheel goes to), then
    rename that directory ``publish``; if it fails, its output goes to ``publish.failed``."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        failed = publish.with_name(publish.name + ".failed")
        failed.write_text(f"{command}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    else:
        Path(command[-1]).rename(publish)
    return done.returncode


if __name__ == "__main__":
    sys.exit(_build_and_publish(Path(sys.argv[1]), sys.argv[2:]))
