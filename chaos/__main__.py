"""``python -m chaos [--seed N] [--quick] [--out PATH] [--work-dir DIR]``: one chaos run.

Exit code 0 when every job finished with its exact output (0 lost, 0 duplicated), no stale
coordinator deleted a live file and no hostile message got ``UNKNOWN``/``INTERNAL``; else 1.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from chaos.suite import Plan, Run, summary, write_result

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "bench" / "results" / "chaos.json"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=1, help="the plan's seed (replays a run)")
    parser.add_argument("--quick", action="store_true", help="the short subset (about 1 min)")
    parser.add_argument("--out", type=Path, default=None, help=f"result file ({DEFAULT_OUT})")
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="logs, storage and AOF (kept if given)"
    )
    args = parser.parse_args(argv)
    plan = Plan.quick() if args.quick else Plan.full()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="snapflow-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    run = Run(args.seed, plan, work)
    # Ctrl-C (SIGINT) or SIGTERM: asyncio.run cancels the run, whose ``finally`` kills every
    # process it started by PID; the outer ``finally`` kills what is left if that was cut short.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        result = asyncio.run(run.run())
    except KeyboardInterrupt:
        print(f"chaos run (seed {args.seed}): interrupted; work dir {work}", file=sys.stderr)
        return 130
    finally:
        run.kill_all()
    ok = Run.ok(result)
    out = args.out or (None if args.quick else DEFAULT_OUT)
    if out is not None:
        write_result(result, out)
    print(summary(result))
    print(f"chaos run (seed {args.seed}): {'PASSED' if ok else 'FAILED'}; work dir {work}")
    if ok and args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
