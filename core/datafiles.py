"""Where profile and scenario files are found: a built-in name in the package, or a YAML path."""
from __future__ import annotations

from importlib import resources
from pathlib import Path


def builtin_dir(folder: str) -> Path:
    return Path(str(resources.files("core").joinpath(folder)))


def builtin_names(folder: str) -> list[str]:
    return sorted(p.stem for p in builtin_dir(folder).glob("*.yaml"))


def resolve(folder: str, kind: str, name_or_path: str) -> Path:
    """A bare name means a built-in file in `folder`; anything with a suffix is a path. Missing -> a clear error."""
    p = Path(name_or_path)
    if not p.suffix:
        p = builtin_dir(folder) / f"{name_or_path}.yaml"
    if not p.exists():
        raise FileNotFoundError(f"{kind} {name_or_path!r}: no such file; built-in: {builtin_names(folder)}")
    return p
