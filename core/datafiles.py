"""Where profile and scenario files are found, and how a data file is read.

A goal names its data (`scenario`, `sim_profile`) by *name* only: `resolve_name` finds `<name>.yaml` in the
built-in folder of the package or in a configured data directory (`use_data_dirs`: the service's
`TUNELOOP_DATA_DIRS`, `--data-dir` of the CLI), each holding `scenarios/` and `profiles/`, and checks that the
resolved file (symlinks followed) stays inside that directory. A field of a request never becomes a path.
The local user of the CLI may still hand a path to `resolve` (`tuneloop sim run --scenario my.yaml`).

Every YAML read goes through `read_yaml`: bounded in size, and its errors name the file and the line, never
its content (a data file may hold anything, and its errors reach API clients).
"""
from __future__ import annotations

import os
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml
from pydantic import ValidationError

MAX_YAML_BYTES = 1 << 20  # no goal, scenario, profile, targets or tokens file is anywhere near 1 MiB
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,119}$")
_DIRS: list[Path] = []
_ON_CHANGE: list[Callable[[], None]] = []  # the loaders' caches, emptied when the data directories change


def on_change(clear: Callable[[], None]) -> None:
    """A loader registers its cache here (so this module never imports the loaders)."""
    _ON_CHANGE.append(clear)


class DataFileError(ValueError):
    """A data file that cannot be used; the message names the file and the reason, never its content."""


def builtin_dir(folder: str) -> Path:
    return Path(str(resources.files("core").joinpath(folder)))


def use_data_dirs(dirs: Iterable[str | Path]) -> None:
    """Add data directories (each with `scenarios/` and `profiles/`) searched after the built-in ones."""
    added = False
    for d in dirs:
        p = Path(d).expanduser().resolve()
        if not p.is_dir():
            raise DataFileError(f"data directory {str(d)!r}: not a directory")
        if p not in _DIRS:
            _DIRS.append(p)
            added = True
    if added:  # a name may now resolve where it did not before
        for clear in _ON_CHANGE:
            clear()


ENV = "TUNELOOP_DATA_DIRS"  # the data directories, os.pathsep-separated: what a process launched here inherits


def env_dirs() -> list[str]:
    return [d for d in os.environ.get(ENV, "").split(os.pathsep) if d.strip()]


def share_with_children(dirs: Iterable[str | Path]) -> None:
    """Add `dirs` to $TUNELOOP_DATA_DIRS, so what this process launches on a local target (the load generator,
    `tuneloop load run`, which reads it) resolves the same scenario names."""
    extra = [str(Path(d).expanduser().resolve()) for d in dirs]
    if extra:
        os.environ[ENV] = os.pathsep.join(dict.fromkeys(env_dirs() + extra))


def data_dirs(folder: str) -> list[Path]:
    """The folders a name of this kind is looked up in, built-in first."""
    return [builtin_dir(folder)] + [d / folder for d in _DIRS if (d / folder).is_dir()]


def builtin_names(folder: str) -> list[str]:
    return sorted({p.stem for d in data_dirs(folder) for p in d.glob("*.yaml") if NAME.match(p.stem)})


def resolve_name(folder: str, kind: str, name: str) -> Path:
    """`<name>.yaml` inside one of the data directories of `folder`; a clear error for anything else."""
    if not isinstance(name, str) or not NAME.match(name):
        raise DataFileError(f"must be the name of a {kind} in the data directories (letters, digits, '-', '_'; "
                            f"no path, no suffix); known: {builtin_names(folder)}")
    for d in data_dirs(folder):
        root = d.resolve()
        p = (root / f"{name}.yaml").resolve()
        if root not in p.parents:  # a symlink out of the data directory
            continue
        if p.is_file():
            return p
    raise DataFileError(f"no {kind} named {name!r} in the data directories; known: {builtin_names(folder)}")


def resolve(folder: str, kind: str, name_or_path: str) -> Path:
    """A bare name is looked up like `resolve_name`; anything with a suffix or a slash is a path the local
    user gave (CLI, tests), used as it is. Missing -> a clear error."""
    if NAME.match(name_or_path):
        try:
            return resolve_name(folder, kind, name_or_path)
        except DataFileError as e:
            raise FileNotFoundError(f"{kind} {name_or_path!r}: no such file; {e}") from None
    p = Path(name_or_path)
    if not p.is_file():
        raise FileNotFoundError(f"{kind} {name_or_path!r}: no such file; built-in: {builtin_names(folder)}")
    return p


def read_text(path: Path, what: str, limit: int = MAX_YAML_BYTES) -> str:
    """The file's text, refused beyond `limit` bytes (read at most limit + 1)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise DataFileError(f"{what}: cannot read ({e.strerror or type(e).__name__})") from None
    if len(data) > limit:
        raise DataFileError(f"{what}: larger than {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise DataFileError(f"{what}: not UTF-8 text") from None


def read_yaml(path: Path, what: str, limit: int = MAX_YAML_BYTES) -> Any:
    """Parse a bounded YAML file; a syntax error names the line, not the text around it."""
    text = read_text(path, what, limit)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise DataFileError(f"{what}: not valid YAML{where}") from None


def validation_summary(e: Any) -> str:
    """A pydantic ValidationError as 'field: reason; ...' without the offending input."""
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(file)'}: {err['msg']}"
                     for err in e.errors(include_input=False, include_url=False))[:600]


def loader(folder: str, kind: str, model: Any, cache_size: int,
           finish: Callable[[Any, Path, str], Any] | None = None) -> Callable[[str], Any]:
    """`load(name_or_path)` for one kind of data file: resolved like `resolve`, read by `read_yaml`, validated
    into `model` (anything with a `model_validate`), completed by `finish(value, path, what)` where given (a file
    it names beside it), cached, and the cache emptied when the data directories change."""
    @lru_cache(maxsize=cache_size)
    def load(name_or_path: str) -> Any:
        p = resolve(folder, kind, name_or_path)
        data = read_yaml(p, f"{kind} {name_or_path!r}")
        try:
            value = model.model_validate(data)
        except ValidationError as e:
            raise DataFileError(f"{kind} {name_or_path!r}: not a valid {kind} ({validation_summary(e)})") from None
        return value if finish is None else finish(value, p, f"{kind} {name_or_path!r}")
    load.__doc__ = f"A {kind} by name (built-in or in a data directory), or a YAML file by path."
    on_change(load.cache_clear)
    return load
