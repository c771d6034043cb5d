"""The autotuner's winners on disk: one JSON file shared by every process of a user.

The file is ``autotune.json`` in ``$CUPYCONV_CACHE_DIR``, else in ``$XDG_CACHE_HOME/cupyconv``, else
in ``~/.cache/cupyconv`` (read from the environment at each use). It holds
``{"format": FORMAT, "entries": {key: entry}}``; keys and entries are the tuner's (cupyconv/tuning.py:
device, problem, precision and cupyconv version in the key; the winning plan and its timings in the entry).

Processes may tune at the same time. A writer takes an exclusive ``flock`` on a lock file beside
the cache (``autotune.json.lock``, never deleted: deleting it would let two writers lock two
different files), re-reads the file, merges its entry into what it finds, writes the result to a
temporary file in the same directory and moves it over the cache with ``os.replace`` (atomic on one
file system). Readers take no lock: they see the old file or the new one, never a torn one, and no
writer drops another's entries. A cache that cannot be read (corrupt, not JSON, of another form) or
written (a read-only or missing directory) is ignored with a warning: tuning then keeps its
winners in memory alone, and a corrupt file is replaced by the next write.
"""
from __future__ import annotations

import json
import os
import pathlib
import tempfile
import warnings

try:
    import fcntl
except ImportError:  # Windows: no flock; the atomic replace still keeps the file whole
    fcntl = None

#: The environment variable naming the cache's directory.
DIRECTORY_VARIABLE = "CUPYCONV_CACHE_DIR"
FILENAME = "autotune.json"
#: The file's layout; a file of another format is ignored (and replaced by the next write).
FORMAT = 1


def path() -> pathlib.Path:
    """The cache file, where the environment says now."""
    directory = os.environ.get(DIRECTORY_VARIABLE)
    if not directory:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        directory = os.path.join(base, "cupyconv")
    return pathlib.Path(directory) / FILENAME


def load(file: pathlib.Path | None = None) -> dict:
    """The entries of the cache ``file`` (default: path()); {} where there is none, and, with a
    warning, where it cannot be read or is not a cache of this format."""
    file = path() if file is None else file
    entries, fault = _read(file)
    if fault:
        warnings.warn(f"cupyconv's autotune cache {file} {fault}", stacklevel=2)
    return entries


def _read(file: pathlib.Path) -> tuple[dict, str]:
    """(the entries of ``file``, "") or ({}, what is wrong with it); a missing file has no entries
    and nothing wrong."""
    try:
        text = file.read_text()
    except FileNotFoundError:
        return {}, ""
    except OSError as error:
        return {}, f"cannot be read ({error}); ignored"
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            raise ValueError(f"not a cache of format {FORMAT}")
    except ValueError as error:  # json.JSONDecodeError is a ValueError
        return {}, f"is corrupt ({error}); ignored (the next tuning rewrites it)"
    return data["entries"], ""


def store(key: str, entry: dict, file: pathlib.Path | None = None) -> None:
    """Add ``entry`` under ``key`` to the cache ``file`` (default: path()), keeping every entry other
    processes wrote meanwhile; a warning, never an error, where the file cannot be written."""
    file = path() if file is None else file
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{file}.lock", "a") as lock:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            # What is wrong with a file about to be replaced was told at the lookup before tuning.
            entries = _read(file)[0]
            entries[key] = entry
            handle, temporary = tempfile.mkstemp(prefix=f".{FILENAME}.", dir=file.parent)
            try:
                os.chmod(temporary, 0o644)  # readable as a file open() makes (mkstemp's are private)
                with os.fdopen(handle, "w") as out:
                    json.dump({"format": FORMAT, "entries": entries}, out, indent=1, sort_keys=True)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temporary, file)
            except BaseException:
                os.unlink(temporary)
                raise
    except OSError as error:
        warnings.warn(f"cupyconv's autotune cache {file} cannot be written ({error}); the tuned plan is kept "
                      f"in memory only", stacklevel=2)
