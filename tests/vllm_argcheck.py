"""Run by the vLLM venv's python (not the project's): feed argv lists to the installed vLLM's own `vllm serve` parser.

stdin: a JSON list of argv lists (each without the leading `vllm`, starting with "serve"); stdout: one JSON list of
{"ok": bool, "error": str | None, "inexact": [flags that are no option string of the parser, e.g. an
abbreviation argparse would accept], "args": {dest: value} | None}. The parser is the one `vllm` builds
(vllm/entrypoints/cli/main.py): a FlexibleArgumentParser with the `serve` subcommand's subparser_init
(make_arg_parser), then the subcommand's own validate().
"""
from __future__ import annotations

import contextlib
import io
import json
import sys

from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser


def parser():
    top = FlexibleArgumentParser(description="vLLM CLI")
    sub = top.add_subparsers(required=False, dest="subparser")
    cmd = ServeSubcommand()
    cmd.subparser_init(sub).set_defaults(dispatch_function=cmd.cmd)
    return top, cmd


def option_strings(top) -> set[str]:
    sub = next(a for a in top._actions if a.dest == "subparser")
    return {o for a in sub.choices["serve"]._actions for o in a.option_strings}


def check(argv: list[str]) -> dict:
    top, cmd = parser()
    known = option_strings(top)
    inexact = [a.split("=", 1)[0] for a in argv if a.startswith("--") and a.split("=", 1)[0] not in known]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = top.parse_args(argv)
            cmd.validate(args)
    except SystemExit as e:
        return {"ok": False, "error": (err.getvalue() or f"exit {e.code}").strip()[-800:], "inexact": inexact,
                "args": None}
    except Exception as e:  # noqa: BLE001 - validate() raises ValueError/TypeError; report them all
        return {"ok": False, "error": f"{type(e).__name__}: {e}"[-800:], "inexact": inexact, "args": None}
    return {"ok": True, "error": None, "inexact": inexact, "args": {k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
                                                 for k, v in vars(args).items() if k != "dispatch_function"}}


if __name__ == "__main__":
    print(json.dumps([check(a) for a in json.load(sys.stdin)]))
