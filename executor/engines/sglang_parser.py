"""SGLang's own command-line parsers (server and router), installed once per machine, to check what tuneloop renders.

`sglang.srt.server_args` builds its argparse parser (`ServerArgs.add_cli_args`, what `prepare_server_args` uses)
without a GPU, but importing it pulls torch, triton and a handful of light packages (sglang/srt/utils/common.py
imports them at module level). So the pinned wheel goes, with exactly those, into its own virtual environment
under the tuneloop cache (/var/cache/tuneloop/sglang-<version>-parser-py<x.y>/, beside the llama.cpp build;
TUNELOOP_LLAMACPP_CACHE moves the root): `sglang==0.5.23 --no-deps` (hash-pinned), the CPU torch that pip finds on
local disk, triton and the rest pinned below, plus `sglang-router==0.3.2` (hash-pinned) for its launch_router
parser and `vllm-router==0.1.17` (hash-pinned, vLLM's PD router) for its. ~2.5 GB on disk, a few minutes the first time; later calls reuse it.

    python -m executor.engines.sglang_parser          # install (if needed) and prove the parser builds
    check(argvs) -> [None | "error text"]    # one entry per argv (the arguments after `-m sglang.launch_server`)

Only the parse runs (argparse: flag names, value types, choices); `ServerArgs.__post_init__`, which reads the
model and the devices, does not.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from executor.engines.llamacpp_build import cache_root

VERSION = "0.5.23"
WHEEL_SHA256 = "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"  # cp311 manylinux_2_34 x86_64
ROUTER_VERSION = "0.3.2"  # sglang-router: its launch_router parser needs its Rust extension and these three
ROUTER_SHA256 = "ba5a24951e5e0357fe390782fcd1abd861448a87216832dbf2e501a1dd1548eb"  # abi3 manylinux2014 x86_64
ROUTER_DEPS = ("setproctitle==1.3.8", "uvicorn==0.54.0", "fastapi==0.165.0")
# vllm-router (vLLM's PD router, PyPI `vllm-router`): its argument definitions (vllm_router/router_args.py) are
# stdlib-only, so the wheel alone goes into the same environment
VLLM_ROUTER_VERSION = "0.1.17"
VLLM_ROUTER_SHA256 = "85c96bea4d573a49b5a8ae4c72ee3dfe733aba26b6f1ff1256e6142f1f42694d"  # abi3 manylinux_2_28 x86_64
# what `import sglang.srt.server_args` needs on a CPU-only machine (found by importing it in an empty venv)
DEPS = ("torch==2.13.0+cpu", "triton==3.9.0", "numpy==2.4.6", "orjson==3.13.0", "psutil==7.2.2", "pybase64==1.5.1",
        "requests==2.34.2", "pydantic==2.14.4", "pyzmq==27.3.0", "tqdm==4.70.1", "ipython==9.18.1",
        "aiohttp==3.14.5", "pillow==13.0.0", "starlette==1.10.0", "typing_extensions==4.16.0", "packaging==26.4",
        "msgspec==0.23.0")

# run by the parser environment's python: {"kind": "server"|"router", "argvs": [...]} on stdin, one verdict each
CHECK = r"""
import argparse, contextlib, io, json, sys
job = json.load(sys.stdin)
if job["kind"] == "server":
    from sglang.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    parse = parser.parse_args
elif job["kind"] == "router":
    from sglang_router.launch_router import parse_router_args as parse
else:  # vllm-router: what its launch_router.parse_router_args builds
    from vllm_router.router_args import RouterArgs
    parser = argparse.ArgumentParser(prog="vllm-router")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    parse = lambda argv: RouterArgs.from_cli_args(parser.parse_args(argv), use_router_prefix=False)
out = []
for argv in job["argvs"]:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parse(argv)
        out.append(None)
    except (SystemExit, ValueError) as e:
        out.append((err.getvalue().strip().splitlines() or [str(e)])[-1])
print(json.dumps(out))
"""


class ParserUnavailable(RuntimeError):
    """The SGLang parser environment could not be installed or does not import; the message says why."""


def env_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / f"sglang-{VERSION}-parser-py{sys.version_info.major}.{sys.version_info.minor}"


def python(root: Path | None = None) -> Path | None:
    """The parser environment's python when a complete install is in the cache (the stamp is written last)."""
    d = env_dir(root)
    exe = d / "bin" / "python"
    return exe if (d / "installed.json").is_file() and exe.is_file() else None


def _run(argv: list[str], log) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise ParserUnavailable(f"sglang parser install: `{' '.join(argv[:4])} ...` exited {rc} (log: {log.name})")


def ensure(root: Path | None = None, echo=print) -> Path:
    """Install the parser environment unless the cache has it; returns its python. Raises ParserUnavailable."""
    d = env_dir(root)
    d.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{d}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installer per machine; the others wait and reuse it
        exe = python(root)
        if exe:
            if not (d / "router.json").is_file():
                _install_router(d, echo)
            if not (d / "vllm-router.json").is_file():
                _install_vllm_router(d, echo)
            return exe
        echo(f"installing SGLang {VERSION}'s argument parser into {d} (once per machine)")
        shutil.rmtree(d, ignore_errors=True)
        with open(f"{d}.log", "w") as log, tempfile.TemporaryDirectory() as tmp:
            _run([sys.executable, "-m", "venv", str(d)], log)
            pip = [str(d / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            req = Path(tmp) / "sglang.txt"
            req.write_text(f"sglang=={VERSION} --hash=sha256:{WHEEL_SHA256}\n")
            _run([*pip, "--no-deps", "--require-hashes", "-r", str(req)], log)
            _run([*pip, *DEPS], log)
        exe = d / "bin" / "python"
        problem = check_with(exe, [["--model-path", "/m"]])[0]
        if problem is not None:
            raise ParserUnavailable(f"sglang parser: a minimal argv does not parse: {problem} (log: {d}.log)")
        (d / "installed.json").write_text(json.dumps({"sglang": VERSION, "deps": DEPS}))
        _install_router(d, echo)
        _install_vllm_router(d, echo)
        return exe


def _install_router(d: Path, echo) -> None:
    """sglang-router's launch_router parser into the same environment (its own stamp: added to older installs)."""
    echo(f"adding sglang-router {ROUTER_VERSION}'s argument parser to {d}")
    exe = d / "bin" / "python"
    with open(f"{d}.log", "a") as log, tempfile.TemporaryDirectory() as tmp:
        pip = [str(exe), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        req = Path(tmp) / "router.txt"
        req.write_text(f"sglang-router=={ROUTER_VERSION} --hash=sha256:{ROUTER_SHA256}\n")
        _run([*pip, "--no-deps", "--require-hashes", "-r", str(req)], log)
        _run([*pip, *ROUTER_DEPS], log)
    problem = check_with(exe, [["--pd-disaggregation", "--prefill", "http://h:1", "8998", "--decode", "http://h:2"]],
                         kind="router")[0]
    if problem is not None:
        raise ParserUnavailable(f"sglang-router parser: a minimal PD argv does not parse: {problem} (log: {d}.log)")
    (d / "router.json").write_text(json.dumps({"sglang-router": ROUTER_VERSION, "deps": ROUTER_DEPS}))


def _install_vllm_router(d: Path, echo) -> None:
    echo(f"adding vllm-router {VLLM_ROUTER_VERSION}'s argument parser to {d}")
    exe = d / "bin" / "python"
    with open(f"{d}.log", "a") as log, tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "vllm-router.txt"
        req.write_text(f"vllm-router=={VLLM_ROUTER_VERSION} --hash=sha256:{VLLM_ROUTER_SHA256}\n")
        _run([str(exe), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--require-hashes",
              "-r", str(req)], log)
    problem = check_with(exe, [["--vllm-pd-disaggregation", "--prefill", "http://h:1", "--decode", "http://h:2"]],
                         kind="vllm-router")[0]
    if problem is not None:
        raise ParserUnavailable(f"vllm-router parser: a minimal PD argv does not parse: {problem} (log: {d}.log)")
    (d / "vllm-router.json").write_text(json.dumps({"vllm-router": VLLM_ROUTER_VERSION}))


def check_with(exe: Path, argvs: list[list[str]], kind: str = "server", timeout_s: float = 300.0) -> list[str | None]:
    """The parser's verdict for each argv (kind "server": after `-m sglang.launch_server`; "router": after
    `-m sglang_router.launch_router`; "vllm-router": after `vllm-router`): None when it parses, else the
    parser's error line."""
    res = subprocess.run([str(exe), "-c", CHECK], input=json.dumps({"kind": kind, "argvs": argvs}),
                         capture_output=True, text=True,
                         timeout=timeout_s, env=os.environ | {"PYTHONWARNINGS": "ignore"})
    if res.returncode != 0:
        raise ParserUnavailable(f"sglang parser exited {res.returncode}: {res.stderr.strip()[-1500:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def check(argvs: list[list[str]], kind: str = "server") -> list[str | None]:
    return check_with(ensure(), argvs, kind)


def main() -> int:
    try:
        exe = ensure()
    except ParserUnavailable as e:
        print(e, file=sys.stderr)
        return 1
    print(f"SGLang {VERSION}, sglang-router {ROUTER_VERSION} and vllm-router {VLLM_ROUTER_VERSION} argument parsers "
          f"ready: {exe}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
