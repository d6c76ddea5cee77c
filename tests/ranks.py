"""Worker processes standing for the ranks of a process group (gloo on the CPU, NCCL on GPUs), for
the tests that need several: a test file runs itself as a script once per rank, each worker prints
one ``RESULT`` line (JSON) per case, and ``spawn`` collects them."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

MARK = "RESULT "


def report(result: dict) -> None:
    """A worker's result of one case: ``case``, ``rank``, ``ok`` and ``error`` or ``data``."""
    print(MARK + json.dumps(result), flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(script: str, argv: list[str], world: int, env: dict, timeout_s: float = 300) -> dict:
    """Run ``script argv`` as ranks 0 … world − 1 of a group on a free local port (``env`` added to the
    environment); returns {case: {rank: result}} of their ``report`` lines, and under ``"_log"`` the
    end of their output. A worker still running after ``timeout_s`` is killed."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world),
           **env}
    procs = [subprocess.Popen([sys.executable, script, *argv], env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=Path(script).parent)
             for r in range(world)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout_s)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results: dict = {}
    for text in outputs:
        for line in text.splitlines():
            if line.startswith(MARK):
                r = json.loads(line[len(MARK):])
                results.setdefault(r["case"], {})[r["rank"]] = r
    results["_log"] = "\n".join(outputs)[-4000:]
    return results
