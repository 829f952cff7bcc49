"""The fixed ports an SGLang instance with attention DP takes above its `--port`, planned per host so two never overlap.

With attention data parallelism (`--attn-dp-size` above 1) SGLang's tokenizer, detokenizer, RPC and metrics sockets
are TCP, not IPC (sglang/srt/server_args.py `PortArgs.init_new`, 0.5.23): on one node without `--dist-init-addr`
the dist-init port is `--port` + ZMQ_TCP_PORT_DELTA (233), and above it `port_base` = dist-init + 1 with
port_base + 0..5 (NUM_DERIVED_PORTS = 6, the load collector's at + 5): seven fixed ports, each checked free at start
("Port is already in use"). Two such instances on one host whose `--port`s are less than seven apart (the golden
P/D: 8100 and 8101) take overlapping blocks and the second does not start. An instance whose block would overlap a
block or a port already planned on its host (every service's port, every prefill's bootstrap port) is moved: it
gets `--dist-init-addr 127.0.0.1:P` with P the first port above its default dist-init port whose block is free, the
address SGLang itself picks on one node (its dist-init host), since PortArgs then derives the block from P.
"""
from __future__ import annotations

from core.errors import FieldError

ZMQ_TCP_PORT_DELTA = 233  # sglang/srt/server_args.py
PORT_ARGS_BLOCK = 7  # the dist-init port, then port_base + 0..5


def block(start: int) -> range:
    return range(start, start + PORT_ARGS_BLOCK)


def dist_init_ports(instances: list[tuple[str, str, int, bool]], taken: dict[str, set[int]]) -> dict[str, int]:
    """For (service name, host, --port, attention DP on) of every instance in start order, and the ports already
    planned per host (`taken`, extended here by each block): the dist-init port of each instance that must be moved
    off its default block (an instance absent from the answer keeps SGLang's default)."""
    moved: dict[str, int] = {}
    for name, host, port, attn_dp in instances:
        if not attn_dp:
            continue  # IPC sockets: no fixed TCP block
        used = taken.setdefault(host, set())
        default = port + ZMQ_TCP_PORT_DELTA
        start = default
        while any(p in used for p in block(start)):
            start += 1
        if start + PORT_ARGS_BLOCK - 1 > 65535:
            raise FieldError("hosts", f"{name} on {host} runs attention DP: SGLang's PortArgs takes "
                             f"{PORT_ARGS_BLOCK} ports above --port {port} + {ZMQ_TCP_PORT_DELTA}, and none are "
                             "free below 65536")
        used.update(block(start))
        if start != default:
            moved[name] = start
    return moved
