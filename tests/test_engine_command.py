"""The engine's own command (executor/engine_command.py) for every engine, from the launch the adapters render: run
by a real shell, each line hands its program exactly the rendered argv and environment and writes the rendered files
(MindIE's config.json, 0640); SGLang's own parser takes the SGLang lines. What a here-document cannot carry is
refused naming the field."""
from __future__ import annotations

import json
import shlex
import stat

import pytest
from engine_command_support import through_a_shell

from core.errors import FieldError
from core.station import Station, full_knobs
from executor.engine_command import HEREDOC, of_rendered, service_shell
from executor.engines.base import ServiceSpec
from executor.targets import Host, Target
from executor.templates import ENGINE_KEY, render


def _pd(engine: str, **over) -> Target:
    return Target(name="pd", kind="local", engine=engine, model="/models/m", run_root="/srv/tl",
                  hosts=(Host(host="10.0.0.1", roles=("prefill",), cards=2, port=8100),
                         Host(host="10.0.0.2", roles=("decode",), cards=2, port=8200),
                         Host(host="10.0.0.3", roles=("router", "load"), cards=0, port=8000)), **over)


def _mixed(engine: str, root: str = "/srv/tl") -> Target:
    return Target(name="one", kind="local", engine=engine, model="/models/m.gguf", run_root=root,
                  hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=1, port=8080),))


def _rendered(target: Target, knobs: dict | None = None):
    st = Station(engine=target.engine, knobs=full_knobs(knobs or {}, ENGINE_KEY[target.engine]), scenario="s",
                 data_version="d", source_identity="s", target=target.name)
    return render(target, st)


TARGETS = {
    "vllm": lambda root: _pd("vllm"),
    "vllm-ascend": lambda root: _pd("vllm-ascend", router_command=("python3", "/opt/vllm-ascend/proxy.py")),
    "sglang": lambda root: _pd("sglang"),
    "llamacpp": lambda root: _mixed("llamacpp", root),
    "mindie": lambda root: _mixed("mindie", root),
}


@pytest.mark.parametrize("engine", sorted(TARGETS))
def test_a_shell_hands_every_program_exactly_the_rendered_launch(engine, tmp_path):
    rendered = _rendered(TARGETS[engine](str(tmp_path / "root")))
    cmd = of_rendered(rendered, "test", "h", engine)
    assert cmd.error is None and cmd.engine == engine and len(cmd.services) == len(rendered.services)
    for line, svc in zip(cmd.services, rendered.services):
        assert through_a_shell(line.shell, tmp_path) == (list(svc.argv), svc.env), svc.name
        for name, text in svc.files.items():  # MindIE: config.json where MIES_CONFIG_JSON_PATH says, 0640
            path = tmp_path / "root" / "svc" / svc.name / name
            assert svc.env["MIES_CONFIG_JSON_PATH"] == str(path)
            assert json.loads(path.read_text()) == json.loads(text)
            assert stat.S_IMODE(path.stat().st_mode) == svc.file_modes[name] == 0o640
    assert all(f"# {svc.name} ({svc.role}) on {svc.host}" in cmd.text() for svc in rendered.services)


def test_a_json_argument_stays_one_quoted_word():
    (svc, *_) = _rendered(_pd("vllm")).services
    line = service_shell(svc).splitlines()[-1]
    kv = svc.argv[svc.argv.index("--kv-transfer-config") + 1]
    assert '"' in kv and f"'{kv}'" in line and shlex.split(line)[len(svc.env):] == list(svc.argv)


def test_sglangs_own_parser_takes_every_line_of_the_command():
    from unavailable import missing

    from executor.engines import sglang_parser

    try:
        exe = sglang_parser.ensure()
    except sglang_parser.ParserUnavailable as e:
        missing(f"SGLang's parser is not installed here: {e}")
    cmd = of_rendered(_rendered(_pd("sglang"), {"max_num_seqs": 96, "max_num_batched_tokens": 16384}), "test")
    words = [shlex.split(s.shell) for s in cmd.services if s.role != "router"]
    argvs = [w[w.index("python") + 1:] for w in words]  # after the environment and the interpreter
    assert all(a[:2] == ["-m", "sglang.launch_server"] for a in argvs), argvs
    verdicts = sglang_parser.check_with(exe, [a[2:] for a in argvs])
    assert verdicts == [None, None], verdicts
    decode = argvs[1]
    assert decode[decode.index("--max-running-requests") + 1] == "96"


def test_llama_servers_own_help_lists_every_flag_of_the_command():
    import subprocess

    from unavailable import missing

    from executor.engines.llamacpp_cli import help_flags, server_binary, unknown_flags

    try:
        binary = server_binary()
    except FileNotFoundError as e:
        missing(f"llama-server is not installed: {e}")
    target = Target(name="one", kind="local", engine="llamacpp", engine_command=(binary,), model="/models/m.gguf",
                    hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=1, port=8080),))
    cmd = of_rendered(_rendered(target, {"parallel": 8, "ctx_size": 8192, "cache_prompt": False}), "test")
    argv = shlex.split(cmd.services[0].shell.splitlines()[-1])
    argv = argv[argv.index(binary):]
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-500:]
    assert unknown_flags(argv, help_flags(out.stdout + out.stderr)) == [], argv
    assert argv[argv.index("--parallel") + 1] == "8" and "--no-cache-prompt" in argv


def test_a_file_no_here_document_can_carry_is_refused_naming_the_field():
    svc = ServiceSpec(name="mixed-0", role="mixed", host="h", port=1, argv=("mindieservice_daemon",),
                      files={"config.json": f"{{\n{HEREDOC}\n}}"})
    with pytest.raises(FieldError) as e:
        service_shell(svc)
    assert e.value.field == "files" and "mixed-0/config.json" in e.value.reason
