"""Finding and loading the package's compiled helper libraries (native/: the op-record
reader and the detectors' kernels), plain C shared libraries loaded with ctypes.

A wheel carries them in rankwatch/_lib; an editable install imports the sources
from the checkout while CMake installs the libraries into site-packages, where the
distribution's RECORD says they are. A source checkout that was never built has
none, and every caller falls back to its pure-Python path. RANKWATCH_NATIVE=0
asks for those fallbacks on purpose.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import threading
from collections.abc import Callable, Iterator, Mapping
from importlib import resources
from typing import Any

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}


def disabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether RANKWATCH_NATIVE=0 turns the compiled paths off."""
    value = (os.environ if env is None else env).get("RANKWATCH_NATIVE", "")
    return value.strip().lower() in ("0", "false", "no", "off")


def candidates(filename: str) -> Iterator[pathlib.Path]:
    """Where `filename` may be, most likely first."""
    yield pathlib.Path(str(resources.files("rankwatch").joinpath("_lib", filename)))
    from importlib import metadata

    from rankwatch import __version__

    try:
        dist = metadata.distribution("rankwatch")
    except metadata.PackageNotFoundError:
        return
    if dist.version != __version__:  # another installation's build: not ours
        return
    for file in dist.files or ():
        if file.name == filename:
            yield pathlib.Path(str(file.locate()))


def load(filename: str, bind: Callable[[ctypes.CDLL], ctypes.CDLL]) -> ctypes.CDLL | None:
    """The library `filename` with its signatures bound, or None where this
    installation has none (or it lacks a symbol `bind` needs). Loaded once."""
    with _lock:
        if filename not in _loaded:
            _loaded[filename] = None
            for path in candidates(filename):
                if path.is_file():
                    try:
                        _loaded[filename] = bind(ctypes.CDLL(str(path)))
                        break
                    except (OSError, AttributeError):
                        continue
        return _loaded[filename]


def bind_int64(lib: ctypes.CDLL, signatures: dict[str, list[Any]]) -> ctypes.CDLL:
    """Give each function of `signatures` its argument types and an int64 result
    (the kernels' convention: a count, or a negative refusal)."""
    for name, argtypes in signatures.items():
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int64
        fn.argtypes = argtypes
    return lib


def kernels(filename: str, bind: Callable[[ctypes.CDLL], ctypes.CDLL]) -> ctypes.CDLL | None:
    """A kernels library, or None where it is not built or RANKWATCH_NATIVE=0."""
    if disabled():
        return None
    return load(filename, bind)
