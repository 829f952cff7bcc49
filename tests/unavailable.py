"""What a test does when something it needs is not on this machine (PostgreSQL, sshd, Chromium, qemu, an engine, a
test-only package): skipped on a developer's machine, failed under CI=true, where `make test` installs and starts
everything, so a missing piece can never pass a CI run as a skip. The one place that reads CI."""
from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(what: str) -> NoReturn:
    """Fail under CI=true, else skip (a module-level call skips the module): `what` says what is missing and how to
    get it."""
    if ON_CI:
        pytest.fail(f"{what} (required under CI=true)", pytrace=False)
    pytest.skip(what, allow_module_level=True)


def need_module(name: str) -> ModuleType:
    """The module, imported; `missing` when it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        missing(f"{name} is not installed ({e}); `make setup` installs the test dependencies")
