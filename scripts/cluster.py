"""A two-node Ray cluster on this machine serving deploy/serve-per-model.yaml, by hand: up, status, down.

python -m scripts.cluster up [--quick] [--workdir DIR]   # head 127.0.0.2, worker 127.0.0.3; prints where it serves
python -m scripts.cluster status [--workdir DIR]         # nodes, sessions, replicas per node (JSON)
python -m scripts.cluster down [--workdir DIR]           # stops exactly what `up` started, by OS session
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

from bench.service import tiny_models
from tests.harness.cluster import Cluster, cluster_serve_config

REPOSITORY = Path(__file__).resolve().parents[1]

DEFAULT_WORKDIR = Path(tempfile.gettempdir()) / "attention-translate-cluster"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="state, logs and the deployed config")
    parser.add_argument("--quick", action="store_true", help="tiny random models instead of the shipped ones")
    parser.add_argument("--workers", type=int, default=1, help="worker nodes besides the head")
    parser.add_argument("--keep-logs", action="store_true", help="down: keep the cluster's temp dir (Ray's logs)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    state = args.workdir / "cluster.json"

    if args.action == "up":
        if state.exists() and any(node.alive() for node in Cluster.load(args.workdir).nodes):
            print(f"a cluster of {args.workdir} is running; `python -m scripts.cluster down` first", file=sys.stderr)
            return 1
        cluster = Cluster.plan(args.workdir, workers=args.workers)
        models = tiny_models(args.workdir / "models") if args.quick else None
        cluster.up(cluster_serve_config(cluster, models, log_level="INFO"))
        print(json.dumps(cluster.status(), indent=2))
        return 0
    if not state.exists():
        print(f"no cluster state in {args.workdir}", file=sys.stderr)
        return 1
    cluster = Cluster.load(args.workdir)
    if args.action == "status":
        print(json.dumps(cluster.status(), indent=2))
        return 0
    cluster.down(keep_temp_dir=args.keep_logs)
    survivors = cluster.survivors()
    if survivors:
        print(f"still running: {survivors}", file=sys.stderr)
        return 1
    print(f"stopped {len(cluster.nodes)} nodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
