"""Every exception a public module exports derives from StateCodecError (the tree in _errors.py)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import statecodec
from statecodec import StateCodecError

ERRORS = Path(statecodec.__file__).with_name("_errors.py")


def _public_modules() -> list[str]:
    names = ["statecodec"]
    for info in pkgutil.walk_packages(statecodec.__path__, "statecodec."):
        if not any(part.startswith("_") for part in info.name.split(".")[1:]):
            names.append(info.name)
    return names


def _exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _public_modules():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (
                not attr.startswith("_")
                and isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__.startswith("statecodec")
            ):
                found[f"{name}.{attr}"] = value
    return found


def test_the_walk_reaches_the_exceptions_of_every_floor() -> None:
    names = {cls.__name__ for cls in _exceptions().values()}
    # the probe's and the proxy's are the ones that once stood outside the tree
    assert {"InvalidState", "KeySourceError", "WireError", "ProbeError", "Unauthenticated"} <= names


def test_every_public_exception_derives_from_state_codec_error() -> None:
    outside = sorted(name for name, cls in _exceptions().items() if not issubclass(cls, StateCodecError))
    assert outside == []


def test_the_drawn_tree_names_every_public_exception() -> None:
    drawn = set(re.findall(r"[├└]── (\w+)", ERRORS.read_text()))
    public = {cls.__name__ for cls in _exceptions().values()} - {"StateCodecError"}
    assert drawn == public
