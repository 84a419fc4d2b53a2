"""The launcher: ``python -m graph_executor_v2.distributed.run --nproc-per-node N script.py [args...]``.

Starts N processes of ``script.py`` on this node with ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set (several nodes: the same command on each with
``--nnodes``, ``--node-rank`` and rank 0's ``--master-addr``). When a process fails, the launcher says which rank
and with what exit code, stops the others (SIGTERM, then SIGKILL after ``--grace`` seconds) and exits with that
code; it exits 0 when every process did.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

from .._help import HelpFormatter


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _check_port(host: str, port: int) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise SystemExit(f"ge2 launcher: --master-port {port} on {host} is in use ({error.strerror}); choose "
                             "another port or pass --master-port 0 for a free one") from None


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m graph_executor_v2.distributed.run", description=__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--nproc-per-node", type=int, required=True, help="processes on this node (one per GPU)")
    parser.add_argument("--nnodes", type=int, default=1, help="nodes (hosts) in the job")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's index among them")
    parser.add_argument("--master-addr", default="127.0.0.1", help="rank 0's address (its node hosts the store)")
    parser.add_argument("--master-port", type=int, default=29500, help="0: a free port (single node only)")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL on failure")
    parser.add_argument("script", help="the training script each process runs")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's own arguments")
    arguments = parser.parse_args(argv)
    if arguments.nproc_per_node < 1:
        parser.error(f"--nproc-per-node: expected >= 1, got {arguments.nproc_per_node}")
    if arguments.nnodes < 1 or not 0 <= arguments.node_rank < arguments.nnodes:
        parser.error(f"--node-rank: expected an int in [0, {arguments.nnodes}), got {arguments.node_rank}")
    if not os.path.isfile(arguments.script):
        parser.error(f"script: no such file {arguments.script!r}")
    if arguments.master_port == 0:
        if arguments.nnodes > 1:
            parser.error("--master-port 0 (a free port) works on one node only: give every node the same port")
        arguments.master_port = _free_port(arguments.master_addr)
    elif arguments.node_rank == 0:
        _check_port(arguments.master_addr, arguments.master_port)
    return arguments


def launch(arguments: argparse.Namespace) -> int:
    world = arguments.nnodes * arguments.nproc_per_node
    processes = []
    for local_rank in range(arguments.nproc_per_node):
        rank = arguments.node_rank * arguments.nproc_per_node + local_rank
        environment = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                           LOCAL_WORLD_SIZE=str(arguments.nproc_per_node), MASTER_ADDR=arguments.master_addr,
                           MASTER_PORT=str(arguments.master_port))
        environment.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off (shared hosts)
        command = [sys.executable, arguments.script, *arguments.script_args]
        processes.append((rank, subprocess.Popen(command, env=environment)))
    try:
        return _supervise(processes, arguments.grace)
    except KeyboardInterrupt:
        _stop(processes, arguments.grace)
        return 130


def _supervise(processes, grace: float) -> int:
    running = dict(processes)
    while running:
        for rank, process in list(running.items()):
            code = process.poll()
            if code is None:
                continue
            del running[rank]
            if code != 0:
                how = f"signal {-code}" if code < 0 else f"exit code {code}"
                sys.stderr.write(f"ge2 launcher: rank {rank} (pid {process.pid}) failed with {how}; stopping the "
                                 f"other {len(running)} rank(s)\n")
                _stop(list(running.items()), grace)
                return code if code > 0 else 128 - code
        time.sleep(0.05)
    return 0


def _stop(processes, grace: float) -> None:
    for _, process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for _, process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(argv=None) -> int:
    return launch(parse(argv))


if __name__ == "__main__":
    sys.exit(main())
