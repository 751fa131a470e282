"""recordforge.WriteDataset inside a user's own pipeline, on every runner, read back by tf.data.

tests/write_dataset_pipeline.py is the user's program: transforms of its own (a Create, a
filter, a reshuffle, a map making records of every kind) and WriteDataset last. It runs on
FnApiRunner in process and with worker processes, and on Beam's portable path (a job service
and an SDK worker pool started here, on 127.0.0.1, and stopped by the test); every output must
be the same, byte for byte, apart from the manifest's `created` time.
"""

from __future__ import annotations

import collections
import json
import pathlib
import re
import subprocess
import sys

import apache_beam as beam
import pyarrow as pa
import pytest
from conftest import read_dataset, read_errors, run_cli
from test_runners import (  # noqa: F401  (servers: a fixture)
    portable_services,
    server_env,
    servers,
)
from write_dataset_pipeline import NUM_ELEMENTS, keep, make_record

import recordforge
from recordforge.schemas import codec
from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.tfrecord.framing import frame_record, read_records
from recordforge.transforms.core.tfrecord.serialized import serialized_element

SCRIPT = pathlib.Path(__file__).with_name("write_dataset_pipeline.py")
FN_API_RUNNER = "--runner=apache_beam.runners.portability.fn_api_runner.FnApiRunner"


def run_script(out: pathlib.Path, *beam_args: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), *beam_args],
        capture_output=True,
        text=True,
        timeout=600,
        env=server_env(),
        cwd=out.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def files_of(out: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def assert_same_output(out: pathlib.Path, reference: pathlib.Path) -> None:
    got, want = files_of(out), files_of(reference)
    assert sorted(got) == sorted(want)
    manifest, expected = (json.loads(f.pop("dataset_info.json")) for f in (got, want))
    assert manifest.pop("created") and expected.pop("created")
    assert manifest == expected
    for name in want:
        assert got[name] == want[name], f"{name} differs from the in-process run"


def expected_records() -> tuple[collections.Counter, int, dict[str, int]]:
    """(the serialized records the user's pipeline makes that WriteDataset can use, the
    elements it keeps, {error kind: elements})."""
    records, kinds, kept = collections.Counter(), collections.Counter(), 0
    for i in range(NUM_ELEMENTS):
        if not keep(i):
            continue
        kept += 1
        try:
            split, data = serialized_element(make_record(i))
            codec.parse(data)
        except InputError as error:
            kinds[error.kind] += 1
            continue
        except Exception:  # noqa: BLE001  (DecodeError: bytes that are no Example)
            kinds["NotAnExample"] += 1
            continue
        records[split, data] += 1
    return records, kept, dict(kinds)


def test_write_dataset_in_a_users_pipeline_on_every_runner(tmp_path, servers):  # noqa: F811
    reference = tmp_path / "in-process"
    run_script(reference, FN_API_RUNNER)
    # What the user's pipeline made is what was written: each usable record once, in a shard;
    # each unusable element in the quarantine.
    records, kept, kinds = expected_records()
    info, parsed = read_dataset(reference)  # tf.data, with the manifest's spec
    assert (info["num_inputs"], info["errors"]["by_kind"]) == (kept, kinds)
    assert info["num_records"] == sum(records.values()) == kept - sum(kinds.values())
    stored = collections.Counter()
    for split, entry in info["splits"].items():
        for shard in entry["shards"]:
            with open(reference / shard["file"], "rb") as f:
                stored.update((split, data) for data in read_records(f))
    named = collections.Counter({key: n for key, n in records.items() if key[0] is not None})
    assert named <= stored  # records that came with a split are in it
    unnamed = collections.Counter(data for (split, data), n in records.items() for _ in range(n))
    assert collections.Counter(data for _, data in stored.elements()) == unnamed
    assert list(info["splits"]) == ["train", "test", "holdout"]
    hashed_test = sum(n for (split, _), n in stored.items() if split == "test")
    assert 0.1 < hashed_test / info["num_records"] < 0.3
    ids = sorted(int(r["id"]) for rows in parsed.values() for r in rows)
    assert len(ids) == info["num_records"] and len(set(ids)) == len(ids)
    assert info["features"]["tags"] == {"dtype": "bytes", "shape": [-1], "optional": True}
    assert (
        info["splits"]["train"]["num_shards"] % 2 == 0 and info["splits"]["train"]["num_shards"] > 2
    )
    assert {e["error"] for e in read_errors(reference)} == set(kinds)
    assert run_cli("verify", reference).returncode == 0

    processes = tmp_path / "processes"
    run_script(
        processes, FN_API_RUNNER, "--direct_num_workers=2", "--direct_running_mode=multi_processing"
    )
    assert_same_output(processes, reference)

    job_port, pool_port, _ = portable_services(servers)
    portable = tmp_path / "portable"
    run_script(
        portable,
        "--runner=PortableRunner",
        f"--job_endpoint=127.0.0.1:{job_port}",
        "--environment_type=EXTERNAL",
        f"--environment_config=127.0.0.1:{pool_port}",
    )
    assert_same_output(portable, reference)


def fn_api_pipeline() -> beam.Pipeline:
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    return beam.Pipeline(runner=FnApiRunner())


def test_one_folder_written_twice_in_a_pipeline_is_refused_and_the_dataset_kept(tmp_path):
    # Both writers staged and committed into it: the run failed with a FileNotFoundError after
    # one of them had replaced the dataset.
    out = str(tmp_path / "out")  # text: the folder, not a pathlib.Path, is what is tested
    with beam.Pipeline() as pipeline:
        _ = pipeline | beam.Create([{"x": i} for i in range(10)]) | recordforge.WriteDataset(out)
    kept = _files(out)
    with pytest.raises(recordforge.errors.UsageError, match="writes .*out already"):
        with beam.Pipeline() as pipeline:
            records = pipeline | beam.Create([{"x": i} for i in range(100)])
            _ = records | "One" >> recordforge.WriteDataset(out, overwrite=True)
            _ = records | "Two" >> recordforge.WriteDataset(f"{out}/", overwrite=True)
    assert _files(out) == kept
    # Two folders in one pipeline are fine.
    with beam.Pipeline() as pipeline:
        records = pipeline | beam.Create([{"x": i} for i in range(100)])
        _ = records | "One" >> recordforge.WriteDataset(str(tmp_path / "a"))
        _ = records | "Two" >> recordforge.WriteDataset(str(tmp_path / "b"))
    assert recordforge.open_dataset(tmp_path / "b").manifest.num_records == 100


def _files(folder: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in pathlib.Path(folder).iterdir() if p.is_file()}


def test_tf_train_example_objects_are_written_as_their_serialized_bytes(tmp_path):
    tf = pytest.importorskip("tensorflow")

    def as_example(i: int):
        feature = {
            "n": tf.train.Feature(int64_list=tf.train.Int64List(value=[i, i * i])),
            "w": tf.train.Feature(float_list=tf.train.FloatList(value=[i / 2])),
        }
        return tf.train.Example(features=tf.train.Features(feature=feature))

    out = tmp_path / "out"
    with fn_api_pipeline() as pipeline:
        _ = (
            pipeline
            | beam.Create(range(200))
            | beam.Map(as_example)
            | recordforge.WriteDataset(str(out), num_shards=2)
        )
    dataset = recordforge.open_dataset(str(out))
    assert dataset.manifest.num_records == 200
    expected = {as_example(i).SerializeToString(deterministic=True) for i in range(200)}
    assert set(dataset.records("train")) == expected
    spec = {k: s.to_dict() for k, s in dataset.manifest.features.items()}
    assert spec == {
        "n": {"dtype": "int64", "shape": [2], "optional": False},
        "w": {"dtype": "float", "shape": [], "optional": False},
    }
    loaded = recordforge.load(str(out), "train")  # tf.data with the manifest's spec
    assert sorted(int(row["w"] * 2) for row in loaded.as_numpy_iterator()) == list(range(200))


def test_an_empty_pcollection_gives_a_train_split_of_no_records(tmp_path):
    # Records without a split are train, but with no record at all the manifest listed no
    # split, and load(out, "train") failed: unknown split.
    out = tmp_path / "out"
    with fn_api_pipeline() as pipeline:
        _ = pipeline | beam.Create([]) | recordforge.WriteDataset(str(out))
    manifest = json.loads((out / "dataset_info.json").read_text())
    assert manifest["splits"] == {
        "train": {"num_records": 0, "num_bytes": 0, "num_shards": 0, "shards": []}
    }
    assert list(recordforge.iterate(str(out), "train")) == []
    assert run_cli("verify", out).returncode == 0


def test_write_dataset_and_reshard_write_the_same_shards_from_the_same_records(tmp_path):
    records = [
        codec.serialize(codec.build_example({"i": ("int64", [i]), "b": ("bytes", [b"z" * i])}))
        for i in range(400)
    ]
    options = {"name": "same", "splits": "a=0.6,b=0.4", "num_shards": 3, "split_salt": "pepper"}
    written = tmp_path / "written"
    with fn_api_pipeline() as pipeline:
        _ = pipeline | beam.Create(records) | recordforge.WriteDataset(str(written), **options)
    source = tmp_path / "records.tfrecord"
    source.write_bytes(b"".join(frame_record(r) for r in reversed(records)))
    resharded = recordforge.reshard(str(source), str(tmp_path / "resharded"), **options)
    shards = sorted(p.name for p in written.glob("same-*"))
    assert len(shards) == 6
    for name in shards:
        assert (written / name).read_bytes() == pathlib.Path(resharded.path(name)).read_bytes()


def test_a_feature_of_two_dtypes_fails_the_pipeline_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    values = [{"x": 1}, {"x": 2}, {"x": 0.5}]
    with pytest.raises(Exception, match="feature 'x' holds int64 values in 2 records and float"):
        with fn_api_pipeline() as pipeline:
            _ = pipeline | beam.Create(values) | recordforge.WriteDataset(str(out))
    assert not (out / "dataset_info.json").exists()
    # Typed by the user, the ints become floats.
    typed = tmp_path / "typed"
    with fn_api_pipeline() as pipeline:
        _ = (
            pipeline
            | beam.Create(values)
            | recordforge.WriteDataset(str(typed), features={"x": "float"})
        )
    dataset = recordforge.open_dataset(str(typed))
    assert sorted(row["x"][0] for row in dataset.examples("train")) == [0.5, 1.0, 2.0]


def test_mistakes_raise_value_errors_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="WriteDataset has no option 'num_host'"):
        recordforge.WriteDataset(str(tmp_path / "a"), num_host=2)
    with pytest.raises(ValueError, match="--write-index needs uncompressed shards"):
        recordforge.WriteDataset(str(tmp_path / "a"), compression="gzip", write_index=True)
    with pytest.raises(ValueError, match=r"--compression: invalid choice: 'zstd' \(choose from"):
        recordforge.WriteDataset(str(tmp_path / "a"), compression="zstd")
    with pytest.raises(ValueError, match="features: feature 'x': dtype 'text'"):
        recordforge.WriteDataset(str(tmp_path / "a"), features={"x": "text"})
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("not a dataset")
    pipeline = fn_api_pipeline()
    with pytest.raises(ValueError, match="is not empty; use --overwrite"):
        _ = pipeline | beam.Create([b""]) | recordforge.WriteDataset(str(full))
    assert (full / "mine.txt").read_text() == "not a dataset"


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        ({"overwrite": "no"}, "overwrite is True or False, got 'no'"),
        ({"num_hosts": 2.5}, "invalid int value: '2.5'"),
        ({"num_hosts": [2]}, "num_hosts takes one value, not a list"),
        ({"max_error_rate": True}, "max_error_rate takes a value, not True"),
        ({"resume": True}, "WriteDataset has no option 'resume'"),
    ],
)
def test_option_values_are_checked_as_the_command_checks_them(tmp_path, options, refusal):
    # They were set as given: "no" turned overwrite on (replacing the dataset), 2.5 hosts went
    # into the manifest, resume was taken and ignored.
    with pytest.raises(recordforge.errors.UsageError, match=re.escape(refusal)):
        recordforge.WriteDataset(str(tmp_path / "a"), **options)


def test_an_output_that_is_a_file_is_refused_and_the_file_kept(tmp_path):
    # WriteDataset and reshard deleted the file and put the dataset's folder in its place.
    notes = tmp_path / "notes.txt"
    notes.write_text("the user's own file")
    with pytest.raises(recordforge.errors.UsageError, match="is a file, not a folder"):
        with beam.Pipeline() as pipeline:
            _ = pipeline | beam.Create([{"x": 1}]) | recordforge.WriteDataset(str(notes))
    dataset = tmp_path / "dataset"
    with beam.Pipeline() as pipeline:
        _ = pipeline | beam.Create([{"x": 1}]) | recordforge.WriteDataset(str(dataset))
    with pytest.raises(recordforge.errors.UsageError, match="is a file, not a folder"):
        recordforge.reshard(str(dataset), str(notes))
    result = run_cli("reshard", str(dataset), "--output", str(notes))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().endswith("is a file, not a folder"), result.stderr
    assert notes.read_text() == "the user's own file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset", "notes.txt"]


def test_a_dataset_written_after_the_pipeline_was_built_is_not_replaced(tmp_path):
    # The empty folder was checked when the transform was applied; the commit then replaced
    # whatever recordforge dataset had been written there since, without overwrite.
    out = tmp_path / "out"
    pipeline = beam.Pipeline()
    _ = pipeline | beam.Create([{"x": i} for i in range(5)]) | recordforge.WriteDataset(str(out))
    with beam.Pipeline() as other:
        _ = other | beam.Create([{"y": i} for i in range(7)]) | recordforge.WriteDataset(str(out))
    written_meanwhile = files_of(out)
    with pytest.raises(Exception, match="output folder .* received a dataset .* left as it is"):
        pipeline.run().wait_until_finish()
    assert files_of(out) == written_meanwhile
    # With overwrite the later pipeline replaces it.
    pipeline = beam.Pipeline()
    records = pipeline | beam.Create([{"x": i} for i in range(5)])
    _ = records | recordforge.WriteDataset(str(out), overwrite=True)
    pipeline.run().wait_until_finish()
    assert recordforge.open_dataset(out).manifest.num_records == 5


def test_the_readme_example_runs_as_written(tmp_path, monkeypatch):
    """The README's WriteDataset example, its two gs:// paths made local folders."""
    import re

    import pyarrow.parquet as pq

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(
        r"### `recordforge.WriteDataset` in your own pipeline\n\n.*?```python\n(.*?)```",
        readme,
        re.S,
    ).group(1)
    (tmp_path / "events").mkdir()
    rows = {
        "id": list(range(500)),
        "clicks": [i % 4 for i in range(500)],
        "title": [f"title {i}" for i in range(500)],
        "tags": [["a", "b"][: i % 3] for i in range(500)],
    }
    pq.write_table(pa.table(rows), tmp_path / "events" / "part-0.parquet")
    code = block.replace("gs://bucket/events", str(tmp_path / "events"))
    code = code.replace("gs://bucket/clicks", str(tmp_path / "clicks"))
    namespace: dict = {}
    exec(code, namespace)  # the README's code, as a user would paste it
    info = json.loads((tmp_path / "clicks" / "dataset_info.json").read_text())
    assert info["num_records"] == 375  # rows with clicks
    assert info["features"]["clicks"] == {"dtype": "float", "shape": [], "optional": False}
    # Every row has its tags, some an empty list: a list feature no record lacks.
    assert info["features"]["tags"] == {"dtype": "bytes", "shape": [-1], "optional": False}
    assert sum(1 for _ in namespace["train"]) == info["splits"]["train"]["num_records"]
