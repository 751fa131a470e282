"""gs:// end to end, against gcp-storage-emulator on 127.0.0.1: inputs, outputs and every reader.

Each test uploads its inputs with the google-cloud-storage client, runs the installed CLI on
gs:// paths and reads the bucket back with the same client, comparing with a local run.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest
from apache_beam.io.filesystem import BeamIOError
from conftest import BAD_FILES, make_image

from recordforge.pipelines import iterate
from recordforge.pipelines.dataset import open_dataset
from recordforge.pipelines.preflight import resolve_sources
from recordforge.pipelines.verify import verify_dataset
from recordforge.transforms.core.errors import UsageError
from recordforge.transforms.listing import list_files
from recordforge.transforms.write import publish

OPTIONS = ("--name", "pets", "--splits", "train=0.7,validation=0.3", "--num-shards", "2")


def upload(gcs, local: pathlib.Path, bucket: str, prefix: str) -> None:
    """Every file under `local` → gs://bucket/prefix/<its relative path>."""
    target = gcs.client().bucket(bucket)
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        target.blob(f"{prefix}/{path.relative_to(local).as_posix()}").upload_from_filename(path)


def download(gcs, bucket: str, prefix: str) -> dict[str, bytes]:
    """Every object under gs://bucket/prefix/: {relative name: bytes}."""
    return {
        blob.name[len(prefix) + 1 :]: blob.download_as_bytes()
        for blob in gcs.client().list_blobs(bucket, prefix=prefix + "/")
    }


def local_files(folder: pathlib.Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def assert_same_dataset(remote: dict[str, bytes], local: dict[str, bytes]) -> None:
    """The same files; shards and index files byte for byte; manifests equal but for paths."""
    assert sorted(remote) == sorted(local)
    for name in local:
        if ".tfrecord-" in name:
            assert remote[name] == local[name], name
    remote_info, local_info = (json.loads(d["dataset_info.json"]) for d in (remote, local))
    for key in ("splits", "features", "labels", "num_inputs", "num_records", "plan"):
        assert remote_info[key] == local_info[key], key
    for key in ("count", "files", "by_stage", "by_kind"):
        assert remote_info["errors"][key] == local_info["errors"][key], key


def test_image_folder_gs_to_gs_matches_a_local_run(gcs, bucket, photo_folder, tmp_path, cli):
    upload(gcs, photo_folder, bucket, "in/photos")
    output = f"gs://{bucket}/out"

    result = cli("convert", f"gs://{bucket}/in/photos", "-o", output, "--write-index", *OPTIONS)
    assert result.returncode == 0, result.stderr
    local = cli("convert", photo_folder, "-o", tmp_path / "local", "--write-index", *OPTIONS)
    assert local.returncode == 0, local.stderr

    remote = download(gcs, bucket, "out")
    # Nothing else in the bucket's output: no temporary folder, no write-test file.
    assert sorted(remote) == sorted(
        [
            "dataset_info.json",
            "errors/probe.jsonl",
            *(
                f"{folder}pets-{split}.tfrecord-0000{i}-of-00002{suffix}"
                for split in ("train", "validation")
                for i in range(2)
                for folder, suffix in (("", ""), ("index/", ".idx"))
            ),
        ]
    )
    assert_same_dataset(remote, local_files(tmp_path / "local"))
    info = json.loads(remote["dataset_info.json"])
    assert info["num_inputs"] == 15 and info["num_records"] == 10
    assert info["source"]["ignored_hidden_files"] == 2
    errors = [json.loads(line) for line in remote["errors/probe.jsonl"].decode().splitlines()]
    assert {e["source"]["path"]: e["error"] for e in errors} == {
        f"gs://{bucket}/in/photos/{name}": kind for name, kind in BAD_FILES.items()
    }

    verified = cli("verify", output, "--deep", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads(verified.stdout)
    assert report["ok"] and report["checked"]["shards"] == 4 and report["checked"]["records"] == 10

    # The reading helpers, in this process, through Beam's GCS filesystem.
    for split in ("train", "validation"):
        assert list(iterate(output, split)) == list(iterate(str(tmp_path / "local"), split))


def test_csv_naming_images_relatively_and_by_gs_uri(gcs, bucket, tmp_path, cli):
    table = tmp_path / "table"
    for i in range(6):
        make_image(table / "imgs" / f"r{i}.png", "PNG", size=(20 + i, 30), seed=40 + i)
    make_image(tmp_path / "elsewhere" / "far.jpg", "JPEG", size=(70, 50), seed=3)
    rows = [f"imgs/r{i}.png,{'ab'[i % 2]},{i}" for i in range(5)]
    rows += ["../table/./imgs/r5.png,b,5"]  # dot segments resolve in a bucket as on a disk
    rows += [f"gs://{bucket}/elsewhere/far.jpg,b,6", "imgs/missing.png,a,7"]
    (table / "labels.csv").write_text("path,label,n\n" + "\n".join(rows) + "\n")
    (table / "schema.yaml").write_text("columns:\n  n: float\n")  # n would be int64 otherwise
    upload(gcs, table, bucket, "in/table")
    upload(gcs, tmp_path / "elsewhere", bucket, "elsewhere")
    roles = ("--image-column", "path", "--label-column", "label")

    result = cli(
        "convert",
        f"gs://{bucket}/in/table/labels.csv",
        "-o",
        f"gs://{bucket}/out",
        f"--schema=gs://{bucket}/in/table/schema.yaml",
        *roles,
        *OPTIONS,
    )
    assert result.returncode == 0, result.stderr
    # The local run reads the gs:// row from the emulator too: the same CSV, the same records.
    schema = f"--schema={table / 'schema.yaml'}"
    local = cli("convert", table / "labels.csv", "-o", tmp_path / "local", schema, *roles, *OPTIONS)
    assert local.returncode == 0, local.stderr

    remote = download(gcs, bucket, "out")
    assert_same_dataset(remote, local_files(tmp_path / "local"))
    info = json.loads(remote["dataset_info.json"])
    assert info["features"]["n"]["dtype"] == "float"
    assert (info["num_inputs"], info["num_records"], info["errors"]["by_kind"]) == (
        8,
        7,
        {"MissingFile": 1},
    )
    (error,) = [json.loads(line) for line in remote["errors/probe.jsonl"].decode().splitlines()]
    assert error["source"] == {"path": f"gs://{bucket}/in/table/labels.csv", "row": 8}
    assert f"file not found: gs://{bucket}/in/table/imgs/missing.png" in error["message"]
    names = {
        r["image/filename"][0]
        for split in info["splits"]
        for r in iterate(f"gs://{bucket}/out", split)
    }
    assert f"gs://{bucket}/elsewhere/far.jpg".encode() in names and b"imgs/r0.png" in names

    sheet = f"gs://{bucket}/report/sheet.html"
    inspected = cli("inspect", f"gs://{bucket}/out", "--json", "--records", "3", "--html", sheet)
    assert inspected.returncode == 0, inspected.stderr
    summary = json.loads(inspected.stdout)
    assert summary["num_records"] == 7 and len(summary["records"]["items"]) == 3
    page = download(gcs, bucket, "report")["sheet.html"]
    assert page.startswith(b"<!DOCTYPE html>") and page.count(b"data:image/") >= 7

    # With --temp_location (as on Dataflow) the workers hand the report over through it.
    planned = cli(
        "plan",
        f"gs://{bucket}/in/table/labels.csv",
        *roles,
        *OPTIONS[2:],
        "--json",
        f"--temp_location=gs://{bucket}/tmp",
    )
    assert planned.returncode == 0, planned.stderr
    assert not download(gcs, bucket, "tmp")  # the report was read and removed
    plan = json.loads(planned.stdout)
    assert (plan["num_inputs"], plan["failed_inputs"]) == (8, 1)
    assert {s: p["num_records"] for s, p in plan["splits"].items()} == {
        s: split["num_records"] for s, split in info["splits"].items()
    }


def _upload_table(gcs, bucket, tmp_path, header: str, rows: list[str]):
    """`rows.csv` (the header, the rows, and a row of the wrong field count, quarantined, as
    the seventh line) in `tmp_path/table`, uploaded under gs://BUCKET/in; returns the folder."""
    table = tmp_path / "table"
    table.mkdir()
    lines = [header, *rows]
    lines.insert(7, "bad,x")
    (table / "rows.csv").write_text("\n".join(lines) + "\n")
    upload(gcs, table, bucket, "in")
    return table


def test_a_table_without_images_gs_to_gs_matches_a_local_run(gcs, bucket, tmp_path, cli):
    # Read column-wise; its encoded records are spilled to the run's temporary folder on gs://
    # and read back by the shard writers.
    table = _upload_table(
        gcs,
        bucket,
        tmp_path,
        "id,kind,score",
        [f"{i},{'xyz'[i % 3]},{i / 3:.3f}" for i in range(2000)],
    )
    args = ("--label-column", "kind", *OPTIONS)
    remote_run = cli("convert", f"gs://{bucket}/in/rows.csv", "-o", f"gs://{bucket}/out", *args)
    assert remote_run.returncode == 0, remote_run.stderr
    local_run = cli("convert", table / "rows.csv", "-o", tmp_path / "local", *args)
    assert local_run.returncode == 0, local_run.stderr
    remote = download(gcs, bucket, "out")
    assert_same_dataset(remote, local_files(tmp_path / "local"))  # no spill file left either
    info = json.loads(remote["dataset_info.json"])
    assert (info["num_records"], info["errors"]["count"]) == (2000, 1)


def test_a_csv_on_gs_read_in_ranges_matches_a_local_whole_reading(
    gcs, bucket, tmp_path, cli, monkeypatch
):
    # Each range is a ranged read of the object (seek, then read to the range's end).
    table = _upload_table(
        gcs,
        bucket,
        tmp_path,
        "id,kind,note",
        [f'{i},{"xyz"[i % 3]},"line\n{i}"' for i in range(2000)],
    )
    args = ("--label-column", "kind", *OPTIONS)
    local_run = cli("convert", table / "rows.csv", "-o", tmp_path / "local", *args)
    assert local_run.returncode == 0, local_run.stderr
    monkeypatch.setenv("RECORDFORGE_CSV_RANGE_MB", "0.005")  # ~5 KB ranges: ~9 of them
    remote_run = cli("convert", f"gs://{bucket}/in/rows.csv", "-o", f"gs://{bucket}/out", *args)
    assert remote_run.returncode == 0, remote_run.stderr
    assert_same_dataset(download(gcs, bucket, "out"), local_files(tmp_path / "local"))


# The CLI, in a process that is killed outright (SIGKILL: no cleanup of any kind) the moment
# the commit starts: every shard has been staged, no final name has been touched.
_KILLED_AT_COMMIT = """
import os, signal, sys
import recordforge.transforms.commit
recordforge.transforms.commit.commit = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
from recordforge.pipelines.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_run_killed_before_its_commit_leaves_nothing_under_final_names(
    gcs, bucket, photo_folder, cli
):
    upload(gcs, photo_folder, bucket, "in/photos")
    args = (f"gs://{bucket}/in/photos", "-o", f"gs://{bucket}/out", *OPTIONS)
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_AT_COMMIT, "convert", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    left = sorted(download(gcs, bucket, "out"))
    assert ".recordforge-lock" in left  # the killed run's
    assert all(n.startswith((".recordforge-staging/", ".recordforge-lock")) for n in left), left
    staged = [n for n in left if ".tfrecord-" in n and n.endswith(".part.json")]
    assert len(staged) == 4  # the shards were staged

    # A reader refuses the folder: it holds no dataset.
    with pytest.raises(UsageError, match="not a recordforge dataset"):
        open_dataset(f"gs://{bucket}/out")
    # The killed run's lock: its process is gone on this host, so the lock is taken over, and
    # --resume keeps the staged shards.
    rerun = cli("convert", *args, "--resume")
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stderr.count("staged by an earlier run") == 4, rerun.stderr
    assert not [n for n in download(gcs, bucket, "out") if n.startswith(".recordforge")]
    report = verify_dataset(f"gs://{bucket}/out")
    assert (report.findings.errors, report.findings.warnings) == (0, 0)
    assert (report.shards, report.records) == (4, 10)


def test_a_run_failed_on_its_error_rate_leaves_the_output_as_it_was(gcs, bucket, photo_folder, cli):
    upload(gcs, photo_folder, bucket, "in/photos")
    output = f"gs://{bucket}/out"
    result = cli("convert", f"gs://{bucket}/in/photos", "-o", output, "--max-error-rate", "0.1")
    assert result.returncode == 1, result.stderr
    assert "5 of 15 inputs failed (33.3%), more than --max-error-rate 0.1 allows" in result.stderr
    assert f"The reasons are in {output}/.recordforge-staging/errors" in result.stderr
    # Only the run's working folder: its errors files, to say why.
    assert sorted(download(gcs, bucket, "out")) == [
        ".recordforge-staging/errors/probe.jsonl",
        ".recordforge-staging/run.json",
    ]


def test_a_missing_bucket_is_a_usage_error(gcs, bucket, photo_folder, cli):
    upload(gcs, photo_folder, bucket, "in/photos")
    result = cli("convert", f"gs://{bucket}/in/photos", "-o", "gs://no-such-bucket-rf/out")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(
        "recordforge: error: cannot write to the output folder 'gs://no-such-bucket-rf/out': "
    )
    assert "404" in result.stderr and "Traceback" not in result.stderr


def test_globs_and_the_commit_renames_on_gs(gcs, bucket, photo_folder):
    """In this process, through Beam's GCS filesystem: what preflight and the commit rely on."""
    upload(gcs, photo_folder, bucket, "in/photos")
    root = f"gs://{bucket}/in/photos"
    assert list_files(f"{root}/*/c?.jpg") == [f"{root}/cat/c1.jpg", f"{root}/cat/c2.jpg"]
    assert list_files(f"{root}/**", limit=3) == sorted(list_files(f"{root}/**"))[:3]
    assert len(list_files(f"{root}/**")) == 17  # hidden files too: discovery counts them
    (source,) = resolve_sources([f"{root}/"])
    assert (source.kind, source.pattern, source.root) == ("images", f"{root}/**", root)

    client = gcs.client().bucket(bucket)
    for name in ("tmp/a", "tmp/b"):
        client.blob(name).upload_from_string(name.encode())
    staged = [(f"gs://{bucket}/tmp/{n}", f"gs://{bucket}/final/{n}") for n in ("a", "b")]
    publish(staged)
    publish(staged)  # a retried commit: the sources are gone, the targets there
    assert download(gcs, bucket, "final") == {"a": b"tmp/a", "b": b"tmp/b"}
    assert download(gcs, bucket, "tmp") == {}
    with pytest.raises(BeamIOError):  # neither there: something else went wrong
        publish([(f"gs://{bucket}/tmp/c", f"gs://{bucket}/final/c")])


def test_split_folders_on_gs_match_a_local_run(gcs, bucket, tmp_path, cli):
    tree = tmp_path / "tree"
    for split, classes in {"train": ("cat", "dog"), "val": ("cat",), "test": ("owl",)}.items():
        for name in classes:
            for i in range(2):
                make_image(tree / split / name / f"{i}.png", "PNG", seed=len(split) + i)
    make_image(tree / ".hidden" / "x.png", "PNG")  # hidden: neither a split nor a class
    upload(gcs, tree, bucket, "in/tree")
    output = f"gs://{bucket}/out"
    result = cli("convert", f"gs://{bucket}/in/tree", "-o", output, "--name", "t")
    assert result.returncode == 0, result.stderr
    assert "train, validation ← val/, test" in result.stdout
    local = cli("convert", tree, "-o", tmp_path / "local", "--name", "t")
    assert local.returncode == 0, local.stderr
    remote = download(gcs, bucket, "out")
    assert_same_dataset(remote, local_files(tmp_path / "local"))
    info = json.loads(remote["dataset_info.json"])
    assert list(info["splits"]) == ["train", "validation", "test"]
    assert info["labels"] == ["cat", "dog", "owl"]
