"""Run a Beam server module with every gRPC listener on 127.0.0.1.

    python -m recordforge.pipelines.loopback \
        apache_beam.runners.portability.local_job_service_main --port 8099
    python -m recordforge.pipelines.loopback \
        apache_beam.runners.worker.worker_pool_main --service_port 50000

Beam's job service (with its artifact staging and the FnApiRunner it runs jobs on) and its SDK
worker pool bind `[::]`, every network interface, and have no option to change it. For a cluster
on one machine (tests, trying the portable path on a laptop) nothing should accept connections
from other machines; this runs the module unchanged with `grpc.server` bound to the loopback
interface, as recordforge's own local runs are. The job service also reports a running job's
figures (GetJobMetrics), which Beam's answers only once the job is done: a launcher's progress
bars then move while the job runs.
"""

from __future__ import annotations

import runpy
import sys

from recordforge.transforms.internals import (
    grpc_listeners_on_loopback,
    job_service_reporting_running_jobs,
)

USAGE = "usage: python -m recordforge.pipelines.loopback MODULE [ARGS...]"


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    module = argv[0]
    sys.argv = [module, *argv[1:]]
    with grpc_listeners_on_loopback(), job_service_reporting_running_jobs():
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
