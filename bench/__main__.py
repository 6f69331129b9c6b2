"""Run every benchmark, or the one named on the command line."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "coordinator": "bench.coordinator_bench",
    "dataplane": "bench.dataplane_bench",
    "ha": "bench.ha_bench",
    "join": "bench.join_bench",
    "kafka": "bench.kafka_bench",
    "keyed_count": "bench.keyed_count_bench",
    "nexmark": "bench.nexmark_bench",
    "security": "bench.security_bench",
    "spark": "bench.spark_bench",
    "state": "bench.state_bench",
    "storage": "bench.storage_bench",
}


def main(argv: list[str]) -> int:
    names = argv or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(
            f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}",
            file=sys.stderr,
        )
        return 2
    for name in names:
        module = importlib.import_module(BENCHMARKS[name])
        rc = module.main()
        if rc:
            return int(rc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
