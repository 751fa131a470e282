"""deploy/ for Dataflow, offline: the Flex Template spec against the real CLI, the template's
entry point on a real conversion, the image definition, and the launch script's commands."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import yaml
from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    StandardOptions,
    WorkerOptions,
)
from conftest import make_image
from deploy_files import DEPLOY, ROOT, beam_pin, copy_sources, dockerfile_stages, pyproject

from recordforge.pipelines import api, cli
from recordforge.pipelines.flex_template import (
    RENAMED,
    RUNNER_OPTIONS,
    convert_arguments,
    template_parameters,
)
from recordforge.pipelines.runner import _all_option_classes, beam_options

METADATA = json.loads((DEPLOY / "dataflow" / "metadata.json").read_text())
PARAMETERS = {p["name"]: p for p in METADATA["parameters"]}
# A value each kind of parameter accepts, to check regexes against and to run through the CLI.
SAMPLES = {
    "sources": "gs://bucket/photos,gs://bucket/more/*.jpg",
    "label_mode": "folder",
    "image_column": "path",
    "label_column": "label",
    "schema": "gs://bucket/schema.yaml",
    "delimiter": ";",
    "null_values": "NA,null",
    "drop_index": "true",
    "stray_files": "unlabeled",
    "check_pixels": "true",
    "follow_symlinks": "false",
    "allowed_root": "gs://bucket/photos,gs://bucket/more",
    "max_image_pixels": "1000000",
    "resize": "224x224",
    "resize_mode": "pad",
    "encode": "jpeg",
    "quality": "90",
    "channels": "3",
    "splits": "train=0.8,validation=0.2",
    "split_column": "split",
    "split_salt": "salt",
    "num_hosts": "8",
    "min_shard_mb": "5.5",
    "max_shard_mb": "150",
    "num_shards": "16",
    "max_error_rate": "0.05",
    "output": "gs://bucket/datasets/photos",
    "name": "photos",
    "compression": "gzip",
    "write_index": "true",
    "tfds": "false",
    "overwrite": "true",
    "resume": "true",
    "verbose": "2",
    "quiet": "0",
}


def test_metadata_lists_exactly_the_convert_options():
    # Straight from the parser `recordforge convert` uses (not through template_parameters).
    from_parser = {
        RENAMED.get(action.dest, action.dest)
        for action in cli.command_parser("convert")._actions
        if action.dest != "help" and action.dest not in RUNNER_OPTIONS
    }
    assert from_parser == {p.name for p in template_parameters()}
    assert set(PARAMETERS) == from_parser, (
        f"missing from metadata.json: {sorted(from_parser - set(PARAMETERS))}; "
        f"not convert options: {sorted(set(PARAMETERS) - from_parser)}"
    )
    assert len(METADATA["parameters"]) == len(PARAMETERS), "a parameter is listed twice"
    assert set(SAMPLES) == from_parser  # this test's own table keeps up too


def test_metadata_fields_follow_dataflows_schema():
    # Template metadata: name and description, then parameters with name, label, helpText
    # (required), isOptional and regexes (optional) -- Dataflow's "Configure Flex Templates".
    assert METADATA["name"] and METADATA["description"]
    for parameter in METADATA["parameters"]:
        assert set(parameter) <= {"name", "label", "helpText", "isOptional", "regexes"}, parameter
        assert re.fullmatch(r"[a-z][a-z0-9_]*", parameter["name"]), parameter["name"]
        assert parameter["label"].strip() and parameter["helpText"].strip()
        assert isinstance(parameter.get("isOptional", False), bool)
        for regex in parameter.get("regexes", []):
            re.compile(regex)


def test_required_parameters_are_the_required_options():
    required = {p.name for p in template_parameters() if p.required}
    assert required == {"sources", "output"}
    assert {n for n, p in PARAMETERS.items() if not p.get("isOptional", False)} == required


def test_regexes_accept_what_the_cli_accepts_and_refuse_the_rest():
    for parameter in template_parameters():
        regexes = PARAMETERS[parameter.name].get("regexes", [])
        assert all(re.fullmatch(r, SAMPLES[parameter.name]) for r in regexes), parameter.name
        if parameter.choices:
            for choice in parameter.choices:
                assert all(re.fullmatch(r, choice) for r in regexes)
            assert not all(re.fullmatch(r, "bogus") for r in regexes)
        if parameter.kind == "switch":
            assert not all(re.fullmatch(r, "maybe") for r in regexes)
        if parameter.value_type in ("int", "float") and parameter.kind != "count":
            assert regexes, f"{parameter.name} takes a number: give it a regex"
            assert not any(re.fullmatch(r, "ten") for r in regexes)
    # On Dataflow the inputs and output are bucket URLs: a path on the launcher VM means nothing.
    for name in ("sources", "output"):
        assert not any(re.fullmatch(r, "/home/me/photos") for r in PARAMETERS[name]["regexes"])


def test_no_parameter_name_is_a_beam_option():
    # The launch passes parameters and Beam's options in one list: a shared name is ambiguous.
    beam_dests = set()
    for cls in _all_option_classes():
        if cls.__name__ == "DaskOptions":
            continue  # registered only once the Dask runner is imported; never on Dataflow
        import argparse

        parser = argparse.ArgumentParser(add_help=False)
        cls._add_argparse_args(parser)
        beam_dests |= {a.dest for a in parser._actions}
    assert not set(PARAMETERS) & beam_dests
    assert "labels" in beam_dests and RENAMED["labels"] in PARAMETERS


def test_every_sample_translates_into_arguments_the_cli_and_beam_accept():
    dataflow_options = [
        "--runner=DataflowRunner",
        "--project=my-project",
        "--region=europe-west1",
        "--temp_location=gs://bucket/temp",
        "--sdk_container_image=europe-west1-docker.pkg.dev/p/r/recordforge:1",
        # Job labels as a dict, a form Beam's Dataflow client reads (apiclient.py): Beam's own
        # --labels, not recordforge's (which the template calls label_mode).
        '--labels={"goog-dataflow-provided-template-type": "flex"}',
    ]
    launch = [f"--{name}={value}" for name, value in SAMPLES.items()] + dataflow_options
    arguments, beam_args = convert_arguments(launch)
    args = cli._parser().parse_args(arguments)  # strict: nothing of Beam's left in there
    assert args.command == "convert"
    assert args.sources == ["gs://bucket/photos", "gs://bucket/more/*.jpg"]
    assert args.output == "gs://bucket/datasets/photos"
    assert (args.labels, args.num_hosts, args.min_shard_mb, args.max_error_rate) == (
        "folder",
        8,
        5.5,
        0.05,
    )
    assert (args.write_index, args.tfds, args.overwrite) == (True, False, True)
    assert (args.verbose, args.quiet, args.compression) == (2, 0, "gzip")
    assert beam_args == dataflow_options
    options = api.pipeline_options(args, beam_args)
    assert options.view_as(StandardOptions).runner == "DataflowRunner"
    assert options.view_as(GoogleCloudOptions).labels == [
        '{"goog-dataflow-provided-template-type": "flex"}'
    ]
    assert options.view_as(WorkerOptions).sdk_container_image.endswith("recordforge:1")


def test_a_switch_that_is_neither_true_nor_false_is_a_usage_error():
    status = subprocess.run(
        [sys.executable, str(DEPLOY / "dataflow" / "flex_template_main.py"), "--overwrite=maybe"],
        capture_output=True,
        text=True,
    )
    assert status.returncode == 2
    assert "overwrite must be true or false" in status.stderr


def test_the_template_entry_point_runs_a_conversion(tmp_path):
    """flex_template_main.py, as the launcher starts it, on local files with the local runner."""
    photos = tmp_path / "photos"
    for index in range(6):
        make_image(photos / f"class{index % 2}" / f"p{index}.png", "PNG", seed=index)
    out = tmp_path / "out"
    launch = [
        f"--sources={photos}",
        f"--output={out}",
        "--num_hosts=2",
        "--write_index=true",
        "--tfds=false",
        "--label_mode=folder",
        "--splits=train=0.5,validation=0.5",
    ]
    status = subprocess.run(
        [sys.executable, str(DEPLOY / "dataflow" / "flex_template_main.py"), *launch],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        timeout=300,
    )
    assert status.returncode == 0, status.stderr
    assert "Submitted the conversion" in status.stdout
    manifest = json.loads((out / "dataset_info.json").read_text())
    assert manifest["num_records"] == 6
    assert manifest["options"]["write_index"] is True
    assert manifest["options"]["sharding"]["num_hosts"] == 2
    assert manifest["labels"] == ["class0", "class1"]
    assert set(manifest["splits"]) == {"train", "validation"}


# --- the image -------------------------------------------------------------------------------


def test_the_image_is_the_sdk_image_with_recordforge_installed():
    text = (DEPLOY / "Dockerfile").read_text()
    launcher, worker = dockerfile_stages(text)
    python = worker.variables.get("PYTHON_VERSION") or re.search(
        r"beam_python([\d.]+)_sdk", worker.image
    ).group(1)
    assert worker.image == f"apache/beam_python{python}_sdk:{beam_pin()}"
    # The image's Python must be one Beam publishes and the project supports.
    beam_pythons = _beam_python_versions()
    assert python in beam_pythons, f"Beam publishes SDK images for {beam_pythons}"
    assert tuple(map(int, python.split("."))) >= _requires_python()
    # The launcher binary comes from Google's base image of the same Python version.
    assert launcher.alias == "launcher"
    assert launcher.image.startswith(
        f"gcr.io/dataflow-templates-base/python{python.replace('.', '')}-template-launcher-base"
    )

    copies = [i for i in worker.instructions if i.keyword == "COPY"]
    copied_from_context = set()
    for instruction in copies:
        sources, destination, stage = copy_sources(instruction)
        if stage:
            assert stage == "launcher"
            assert sources == ["/opt/google/dataflow/python_template_launcher"] == [destination]
            continue
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file in the build context"
            copied_from_context.add(source)
    # Everything `pip install .` needs: pyproject.toml, its readme and every package.
    project = pyproject()
    top_level = {p.split(".")[0] for p in project["tool"]["setuptools"]["packages"]}
    assert {"pyproject.toml", project["project"]["readme"], *top_level} <= copied_from_context

    runs = " ".join(i.arguments for i in worker.instructions if i.keyword == "RUN")
    assert "pip install --no-cache-dir ." in runs
    assert "apache_beam.__version__ != '${BEAM_VERSION}'" in runs
    assert worker.variables["BEAM_VERSION"] == beam_pin()  # re-declared inside the stage
    (entrypoint,) = [i for i in worker.instructions if i.keyword == "ENTRYPOINT"]
    assert json.loads(entrypoint.arguments) == ["/opt/apache/beam/boot"]
    # The Flex Template runs the file the image holds.
    main_file = worker.variables["FLEX_TEMPLATE_PYTHON_PY_FILE"]
    assert any(
        copy_sources(i)[:2] == (["deploy/dataflow/flex_template_main.py"], main_file)
        for i in copies
    )


def test_dockerignore_lets_through_what_the_dockerfile_copies():
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*", "an allow-list: everything else stays out of the build context"
    allowed = {rule[1:] for rule in rules if rule.startswith("!")}
    (_, worker) = dockerfile_stages((DEPLOY / "Dockerfile").read_text())
    for instruction in worker.instructions:
        if instruction.keyword == "COPY" and not copy_sources(instruction)[2]:
            for source in copy_sources(instruction)[0]:
                assert source in allowed, f"{source} is copied but .dockerignore drops it"


def test_cloud_build_builds_the_dockerfile_from_the_repository_root():
    config = yaml.safe_load((DEPLOY / "dataflow" / "cloudbuild.yaml").read_text())
    (step,) = config["steps"]
    assert step["name"] == "gcr.io/cloud-builders/docker"
    assert step["args"][:3] == ["build", "-f", "deploy/Dockerfile"]
    assert step["args"][-1] == "."
    assert config["images"] == ["${_IMAGE}"]


# --- the launch script -----------------------------------------------------------------------


def launch(*args: str) -> list[str]:
    """The command deploy/dataflow/launch.sh would run (DRY_RUN=1 prints it, shell-quoted)."""
    env = {**os.environ, "DRY_RUN": "1", "PROJECT": "my-project", "REGION": "europe-west1"}
    env |= {"BUCKET": "my-bucket", "TAG": "v1"}
    result = subprocess.run(
        ["bash", str(DEPLOY / "dataflow" / "launch.sh"), *args],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return shlex.split(result.stdout)


IMAGE = "europe-west1-docker.pkg.dev/my-project/recordforge/recordforge:v1"


def test_launch_direct_is_a_conversion_the_cli_and_beam_accept():
    command = launch("direct", "gs://my-bucket/photos", "--output", "gs://my-bucket/out")
    assert command[:2] == ["recordforge", "convert"]
    args, beam_args = cli._parser().parse_known_args(command[1:])
    assert args.sources == ["gs://my-bucket/photos"] and args.output == "gs://my-bucket/out"
    options = api.pipeline_options(args, beam_args)
    google = options.view_as(GoogleCloudOptions)
    assert options.view_as(StandardOptions).runner == "DataflowRunner"
    assert (google.project, google.region, google.temp_location) == (
        "my-project",
        "europe-west1",
        "gs://my-bucket/temp",
    )
    assert options.view_as(WorkerOptions).sdk_container_image == IMAGE


def test_launch_run_passes_every_parameter_whole():
    command = launch(
        "run", "gs://b/a,gs://b/c", "gs://b/out", "num_hosts=8", "splits=train=0.9,validation=0.1"
    )
    assert command[:4] == ["gcloud", "dataflow", "flex-template", "run"]
    flags = dict(zip(command[5::2], command[6::2], strict=True))
    assert flags["--template-file-gcs-location"] == "gs://my-bucket/templates/recordforge-v1.json"
    parameters = flags["--parameters"]
    # gcloud's alternate delimiter syntax: ^~^ makes '~' separate the key=value pairs.
    assert parameters.startswith("^~^")
    pairs = dict(item.split("=", 1) for item in parameters[3:].split("~"))
    assert pairs == {
        "sources": "gs://b/a,gs://b/c",
        "output": "gs://b/out",
        "sdk_container_image": IMAGE,
        "num_hosts": "8",
        "splits": "train=0.9,validation=0.1",
    }
    # What the template's entry point then makes of them is a valid conversion.
    arguments, beam_args = convert_arguments([f"--{k}={v}" for k, v in pairs.items()])
    args = cli._parser().parse_args(arguments)
    assert args.sources == ["gs://b/a", "gs://b/c"] and args.num_hosts == 8
    assert beam_options(beam_args).view_as(WorkerOptions).sdk_container_image == IMAGE
    for name in pairs.keys() - {"sdk_container_image"}:
        assert name in PARAMETERS


def test_launch_template_and_image_name_the_same_image_and_metadata():
    template = launch("template")
    assert template[:4] == ["gcloud", "dataflow", "flex-template", "build"]
    flags = dict(zip(template[5::2], template[6::2], strict=True))
    assert flags["--image"] == IMAGE and flags["--sdk-language"] == "PYTHON"
    assert flags["--metadata-file"] == str(DEPLOY / "dataflow" / "metadata.json")
    image = launch("image")
    assert image[:3] == ["gcloud", "builds", "submit"]
    assert image[3] == str(ROOT)
    assert f"_IMAGE={IMAGE}" in image


def test_launch_without_a_command_prints_its_usage():
    result = subprocess.run(
        ["bash", str(DEPLOY / "dataflow" / "launch.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "PROJECT": "p", "REGION": "r", "BUCKET": "b"},
    )
    assert result.returncode == 2 and "Usage" in result.stderr


def _beam_python_versions() -> set[str]:
    import importlib.metadata

    classifiers = importlib.metadata.metadata("apache-beam").get_all("Classifier")
    prefix = "Programming Language :: Python :: "
    return {c[len(prefix) :] for c in classifiers if re.fullmatch(r"3\.\d+", c[len(prefix) :])}


def _requires_python() -> tuple[int, ...]:
    spec = pyproject()["project"]["requires-python"]
    return tuple(map(int, spec.removeprefix(">=").split(".")))
