"""reshard reading gs:// TFRecord files when the store fails part-way through one.

A TFRecord file that cannot be read to its end holds an unknown number of records more: none of
them can be counted, so the run fails (as for a CSV file cut short) and the previous dataset
stays as it was. Against the
storage emulator on 127.0.0.1, behind the proxy of tests/gcs_traffic.py, which answers chosen
requests with an error.
"""

from __future__ import annotations

import urllib.parse
import uuid

import pytest
from conftest import run_cli
from gcs_traffic import proxied_emulator
from test_gcs import download
from test_reshard import examples, write_tfrecords

# Beam's gs:// reader fetches 16 MiB a request: a file of about 40 MB takes three.
RECORDS = 160
RECORD_PADDING = 250_000


@pytest.fixture(scope="module")
def proxied(tmp_path_factory):
    """The emulator behind a fault-injecting proxy; this process and the programs it starts
    talk to the proxy. Yields (emulator, downloads, faults)."""
    with proxied_emulator(tmp_path_factory.mktemp("gcs-reshard")) as servers:
        yield servers


@pytest.fixture(scope="module")
def large_tfrecord(tmp_path_factory):
    """A TFRecord file of RECORDS Examples, each padded to about RECORD_PADDING bytes."""
    import tensorflow as tf

    path = tmp_path_factory.mktemp("large") / "data.tfrecord"
    records = []
    for i, record in enumerate(examples(RECORDS, 5)):
        example = tf.train.Example.FromString(record)
        padding = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"p" * RECORD_PADDING]))
        example.features.feature["padding"].CopyFrom(padding)
        example.features.feature["id"].int64_list.value[:] = [i]
        records.append(example.SerializeToString())
    write_tfrecords(path, records)
    return path


def _upload(emulator, bucket: str, name: str, path) -> str:
    emulator.client().bucket(bucket).blob(name).upload_from_filename(str(path))
    return f"gs://{bucket}/{name}"


def test_a_file_that_fails_part_way_fails_the_run_and_keeps_the_previous_dataset(
    proxied, large_tfrecord
):
    emulator, downloads, faults = proxied
    bucket = f"rf-{uuid.uuid4().hex[:12]}"
    emulator.client().create_bucket(bucket)
    source = _upload(emulator, bucket, "in/data.tfrecord", large_tfrecord)
    out = f"gs://{bucket}/out"
    first = run_cli("reshard", source, "--output", out)
    assert first.returncode == 0, first.stderr
    assert f"into {RECORDS:,} records" in first.stdout
    before = download(emulator, bucket, "out")

    # Once a first 16 MiB of the file has come, every further download of it is refused.
    obj = f"{bucket}/in/data.tfrecord"
    downloads.clear()

    def refused(method: str, path: str) -> bool:
        return (
            method == "GET"
            and "alt=media" in path
            and f"/o/{obj.partition('/')[2]}?" in urllib.parse.unquote(path)
            and any(size > 1 << 20 for size in downloads.of(obj))
        )

    faults.fail(403, when=refused)
    try:
        failed = run_cli("reshard", source, "--output", out, "--overwrite")
    finally:
        faults.clear()
    assert faults.failed >= 1, "no download was refused: the test did not test anything"
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "Traceback" not in failed.stderr, failed.stderr
    (line,) = [line for line in failed.stderr.splitlines() if line.startswith("recordforge: fail")]
    assert "data.tfrecord cannot be read to its end" in line
    assert "how many follow is unknown" in line and line.count(" is as it was") == 1
    assert line.endswith(f"{out} is as it was; nothing staged was kept")
    assert download(emulator, bucket, "out") == before  # nothing of it replaced
