"""One emulated device's worker process: build an object from a factory and serve its methods over RPC
(transport.RpcServer) until a `shutdown` call, SIGTERM / SIGINT, or the death of its parent (the controller).
Voltron §5.1: one process per device of the cluster. See docs/cluster.md ("Emulated cluster: plumbing").

    python -m hil.cluster.worker_main --bind tcp://10.X.0.Y:PORT --factory module:callable \\
        --factory-args '{"k": 1}' [--pid-file PATH] [--parent-pid PID]

No orphans: the worker asks the kernel for SIGTERM when its parent thread dies (prctl PR_SET_PDEATHSIG) and also
polls its parent pid, so a SIGKILLed controller leaves no worker behind. Exit codes: 0 after shutdown / SIGTERM / parent
death, 2 on bad arguments or a factory that cannot be imported or built (one line `error: <key>: …` on stderr).
"""
from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import signal
import sys

from quant.atomic import atomic_write_text

PR_SET_PDEATHSIG = 1


def load_factory(spec: str):
    """`module:callable` -> the callable (ValueError naming the spec on any failure)."""
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"--factory: {spec!r} must be 'module:callable'")
    try:
        obj = importlib.import_module(mod_name)
    except ImportError as e:
        raise ValueError(f"--factory: cannot import {mod_name!r}: {e}") from None
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ValueError(f"--factory: {mod_name!r} has no attribute {attr!r}")
    if not callable(obj):
        raise ValueError(f"--factory: {spec!r} is not callable")
    return obj


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """prctl(PR_SET_PDEATHSIG, sig): True when the kernel accepted it (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hil.cluster.worker_main", description=__doc__.split("\n")[0])
    ap.add_argument("--bind", required=True, help="zmq endpoint to bind, e.g. tcp://10.150.0.1:5555")
    ap.add_argument("--factory", required=True, help="module:callable that builds the served object")
    ap.add_argument("--factory-args", default="{}", help="JSON object of keyword arguments for the factory")
    ap.add_argument("--pid-file", default=None, help="write this process's pid here once serving")
    ap.add_argument("--parent-pid", type=int, default=None, help="exit when this pid is no longer the parent")
    args = ap.parse_args(argv)

    parent = args.parent_pid if args.parent_pid is not None else os.getppid()
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:              # the parent died before prctl took effect
        return 0
    try:
        kwargs = json.loads(args.factory_args)
        if not isinstance(kwargs, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        print(f"error: --factory-args: {e}", file=sys.stderr)
        return 2
    try:
        factory = load_factory(args.factory)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    # after the argument checks: importing zmq is the slow part
    from hil.cluster.transport import RpcServer

    server_box: list[RpcServer] = []

    def on_signal(signum, frame):
        if server_box:
            server_box[0].stop()
        else:
            raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        obj = factory(**kwargs)
    except Exception as e:
        print(f"error: --factory: {args.factory}(**{kwargs!r}) raised {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    server = RpcServer(obj, args.bind)
    server_box.append(server)
    if args.pid_file:
        atomic_write_text(args.pid_file, f"{os.getpid()}\n")
    try:
        server.serve_forever(should_stop=lambda: os.getppid() != parent)
    finally:
        server.close()
        close = getattr(obj, "close", None)
        if callable(close):
            close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
