"""deploy/flink, offline: the operator's FlinkDeployment with Beam's worker-pool sidecar, the job
server, and a submission whose arguments recordforge and Beam accept and that reach them."""

from __future__ import annotations

import re

import yaml
from apache_beam.options.pipeline_options import (
    FlinkRunnerOptions,
    PortableOptions,
    StandardOptions,
)
from deploy_files import DEPLOY

from recordforge.pipelines import api, cli

FLINK = DEPLOY / "flink"
# The Python SDK container's boot program serves the worker pool on this port
# (apache/beam sdks/python/container/boot.go: --worker_pool starts worker_pool_main with
# --service_port=50000).
WORKER_POOL_PORT = 50000


def documents(name: str) -> dict[str, dict]:
    loaded = [d for d in yaml.safe_load_all((FLINK / name).read_text()) if d]
    by_kind = {d["kind"]: d for d in loaded}
    assert len(by_kind) == len(loaded), f"{name}: two documents of one kind"
    for document in loaded:
        assert {"apiVersion", "kind", "metadata", "spec"} <= set(document), document.get("kind")
    return by_kind


SESSION = documents("flink-session.yaml")["FlinkDeployment"]
JOB_SERVER = documents("beam-job-server.yaml")
CONVERT = documents("convert-job.yaml")["Job"]


def container(pod_spec: dict, name: str) -> dict:
    (found,) = [c for c in pod_spec["containers"] if c["name"] == name]
    return found


def flink_minor_of_session() -> str:
    assert SESSION["apiVersion"] == "flink.apache.org/v1beta1"
    match = re.fullmatch(r"v(\d+)_(\d+)", SESSION["spec"]["flinkVersion"])
    assert match, SESSION["spec"]["flinkVersion"]
    return f"{match.group(1)}.{match.group(2)}"


def test_session_cluster_flink_version_is_one_beam_runs_on():
    minor = flink_minor_of_session()
    assert minor in FlinkRunnerOptions.PUBLISHED_FLINK_VERSIONS
    image, tag = SESSION["spec"]["image"].split(":")
    assert image == "flink" and tag.startswith(f"{minor}.")
    assert "job" not in SESSION["spec"], "a session cluster: the job server submits the jobs"
    for role in ("jobManager", "taskManager"):
        resource = SESSION["spec"][role]["resource"]
        assert resource["memory"] and resource["cpu"]


def test_job_server_matches_the_cluster():
    deployment, service = JOB_SERVER["Deployment"], JOB_SERVER["Service"]
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"]
    assert service["spec"]["selector"] == pod["metadata"]["labels"]
    server = container(pod["spec"], "beam-job-server")
    image = re.fullmatch(r"apache/beam_flink([\d.]+)_job_server:(\S+)", server["image"])
    assert image, server["image"]
    assert image.group(1) == flink_minor_of_session()
    arguments = dict(a.lstrip("-").split("=", 1) for a in server["args"])
    # The operator's REST Service for a FlinkDeployment is <name>-rest, port 8081.
    assert arguments["flink-master"] == f"{SESSION['metadata']['name']}-rest:8081"
    assert arguments["job-host"] == "0.0.0.0"  # reachable through the Service
    assert arguments["artifacts-dir"].startswith("gs://")  # shared with the TaskManagers
    container_ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    service_ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert container_ports == {"job": 8099, "artifact": 8098, "expansion": 8097}
    assert service_ports == {name: (port, port) for name, port in container_ports.items()}


def test_task_managers_carry_the_worker_pool_sidecar():
    pod = SESSION["spec"]["taskManager"]["podTemplate"]
    assert pod["apiVersion"] == "v1" and pod["kind"] == "Pod"
    names = [c["name"] for c in pod["spec"]["containers"]]
    assert "flink-main-container" in names  # the operator's name for Flink's own container
    sidecar = container(pod["spec"], "beam-worker-pool")
    assert sidecar["args"] == ["--worker_pool"]
    assert [p["containerPort"] for p in sidecar["ports"]] == [WORKER_POOL_PORT]
    # The same image submits the job: recordforge is importable where the Python code runs.
    submitter = container(CONVERT["spec"]["template"]["spec"], "recordforge-convert")
    assert sidecar["image"] == submitter["image"]


def test_submission_arguments_parse_and_point_at_the_services():
    pod = CONVERT["spec"]["template"]["spec"]
    assert CONVERT["apiVersion"] == "batch/v1" and pod["restartPolicy"] == "Never"
    submit = container(pod, "recordforge-convert")
    assert submit["command"] == ["recordforge"]
    args, beam_args = cli._parser().parse_known_args(submit["args"])
    assert args.command == "convert" and args.sources and args.output.startswith("gs://")
    assert args.num_hosts >= 1
    options = api.pipeline_options(args, beam_args)  # refuses any argument Beam does not know
    portable = options.view_as(PortableOptions)
    assert options.view_as(StandardOptions).runner.rsplit(".", 1)[-1] == "PortableRunner"
    assert portable.environment_type == "EXTERNAL"
    # The TaskManager reaches the worker pool in its own pod.
    assert portable.environment_config == f"localhost:{WORKER_POOL_PORT}"
    service = JOB_SERVER["Service"]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    name = service["metadata"]["name"]
    assert portable.job_endpoint == f"{name}:{ports['job']}"
    assert portable.artifact_endpoint == f"{name}:{ports['artifact']}"
