"""Checking a file argument the command will write before any work starts: a dangling link, a
device, a directory, an existing file (unless overwriting is allowed) or a place the user
cannot write is refused with one line."""

from __future__ import annotations

import os
import stat

__all__ = ["output_problem"]


def output_problem(path: str, *, overwrite: bool) -> str | None:
    """Why ``path`` cannot take the file the command writes, or None. With ``overwrite``
    False an existing file is refused too (the caller offers ``--force``)."""
    if os.path.islink(path) and not os.path.exists(path):
        return f"{path} is a dangling symbolic link (to {os.readlink(path)}); remove it first"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            return f"{path}: directory {parent} does not exist"
        if not os.access(parent, os.W_OK):
            return f"{path}: directory {parent} is not writable"
        return None
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if stat.S_ISDIR(mode):
        return f"{path} is a directory; give a file name"
    if not stat.S_ISREG(mode):
        return f"{path} is not a regular file (a device or a pipe); give a file name"
    if not overwrite:
        return f"{path} exists; pass --force to overwrite it"
    if not os.access(path, os.W_OK):
        return f"{path} is not writable"
    return None
