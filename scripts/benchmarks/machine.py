"""The machine a benchmark suite runs on: its CPU model, whether it is idle, and the CPU other
processes use while a suite runs (a number from a busy machine is not a number to report)."""

from __future__ import annotations

import os
import platform
import time

IDLE_LOAD = 0.5  # 1-minute load average below which a machine counts as idle (before and after a suite)


class OtherLoad:
    """CPU used by OTHER processes while a suite runs, in cores: the machine's busy time (/proc/stat) minus this
    process's own (and its waited-for children's). The 1-minute load average after a suite counts the suite itself."""

    def __init__(self):
        self.wall, self.busy, self.own = time.time(), self._busy(), self._own()

    @staticmethod
    def _busy() -> float:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def stop(self) -> float:
        wall = max(time.time() - self.wall, 1e-9)
        return max(0.0, (self._busy() - self.busy) - (self._own() - self.own)) / wall


def cpu_model() -> str:
    """The CPU's model name: ratios move with it (MKL's fp32 sgemm runs at under half oneDNN's speed on AMD EPYC)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    except OSError:
        return platform.processor() or "unknown"


def wait_until_idle(limit_s: float = 300.0) -> None:
    """Let the 1-minute load average fall below IDLE_LOAD before a suite: after `make setup` or the suite before it
    (two busy cores) it takes ~1.5 minutes. A machine still busy after `limit_s` is measured, and marked busy."""
    start = time.time()
    if os.getloadavg()[0] >= IDLE_LOAD:
        print(f"waiting for the load average ({os.getloadavg()[0]:.2f}) to fall below {IDLE_LOAD} ...", flush=True)
    while os.getloadavg()[0] >= IDLE_LOAD and time.time() - start < limit_s:
        time.sleep(5)
