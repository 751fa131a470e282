"""How many worker processes a local conversion uses when the user does not say
(pipelines/local_workers.py)."""

from __future__ import annotations

import os
import pathlib

import pytest
from conftest import make_image

from recordforge import command
from recordforge.pipelines import cli, local_workers
from recordforge.pipelines.local_workers import choose_local_workers, input_bytes
from recordforge.pipelines.runner import chooses_where_it_runs
from recordforge.transforms.core.records import Source

MIB = 2**20
PER_WORKER = local_workers.BYTES_PER_WORKER


def _sparse(path: pathlib.Path, size: int) -> None:
    """A file of `size` bytes that takes no disk space (st_size is what is counted)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)


def _folder(root: pathlib.Path, index: int = 0, kind: str = "images") -> Source:
    return Source(index, kind, f"{root}/**", str(root), str(root))


@pytest.mark.parametrize(
    ("sizes_in_workers", "cores", "expected"),
    [
        ([0.5], 2, 1),  # below two workers' worth: one process
        ([1.0, 0.9], 2, 1),
        ([1.0, 1.0], 2, 2),  # exactly two workers' worth
        ([3.0, 2.0], 2, 2),  # never more than the cores
        ([1.0, 1.0, 1.0], 4, 3),  # one per BYTES_PER_WORKER
        ([1.0, 1.0, 1.0], 1, 1),  # one core: nothing to gain
    ],
)
def test_one_worker_process_per_share_of_input_up_to_the_cores(
    tmp_path, sizes_in_workers, cores, expected
):
    for index, share in enumerate(sizes_in_workers):
        _sparse(tmp_path / "photos" / "class" / f"{index}.jpg", int(share * PER_WORKER))
    chosen = choose_local_workers([_folder(tmp_path / "photos")], cores=cores)
    assert chosen.count == expected, chosen


def _table(path: pathlib.Path, index: int = 0) -> Source:
    return Source(index, "csv", str(path), str(path.parent), path.name)


def test_csv_tables_count_their_uncompressed_bytes(tmp_path):
    _sparse(tmp_path / "big.csv", 4 * PER_WORKER)
    assert choose_local_workers([_table(tmp_path / "big.csv")], cores=8).count == 4
    _sparse(tmp_path / "half.csv", PER_WORKER)
    assert choose_local_workers([_table(tmp_path / "half.csv")], cores=8).count == 1
    # A gzip file is read whole, by one worker: its bytes buy no second one.
    _sparse(tmp_path / "big.csv.gz", 4 * PER_WORKER)
    gzipped = _table(tmp_path / "big.csv.gz")
    assert choose_local_workers([gzipped], cores=8).count == 1
    # Several tables, by a glob, add up.
    _sparse(tmp_path / "parts" / "a.csv", PER_WORKER)
    _sparse(tmp_path / "parts" / "b.CSV", PER_WORKER)
    parts = Source(0, "csv", f"{tmp_path}/parts/*", str(tmp_path / "parts"), "parts/*")
    assert choose_local_workers([parts], cores=8).count == 2


def test_remote_inputs_stay_in_this_process():
    remote = Source(0, "images", "gs://bucket/photos/**", "gs://bucket/photos", "gs://…")
    assert choose_local_workers([remote], cores=8).count == 1
    table = Source(0, "csv", "gs://bucket/big.csv", "gs://bucket", "gs://bucket/big.csv")
    assert choose_local_workers([table], cores=8).count == 1


def test_the_count_stops_once_every_core_has_its_share(tmp_path):
    for index in range(50):
        _sparse(tmp_path / "photos" / f"{index:02d}.jpg", MIB)
    source = _folder(tmp_path / "photos")
    assert input_bytes([source.pattern], up_to=10**12) == 50 * MIB
    # Stopped at the file that reached the bound, not after all 50.
    assert input_bytes([source.pattern], up_to=5 * MIB) == 5 * MIB
    assert input_bytes([source.pattern], up_to=5 * MIB + 1) == 6 * MIB


def test_hidden_files_links_to_folders_and_several_sources_count_as_the_conversion_lists(
    tmp_path,
):
    photos, more = tmp_path / "photos", tmp_path / "more"
    _sparse(photos / "a" / "1.jpg", 3 * MIB)
    _sparse(photos / ".cache" / "big.bin", 100 * MIB)  # hidden: not converted, not counted
    _sparse(photos / "a" / ".thumb.jpg", 100 * MIB)
    os.symlink(photos, photos / "a" / "loop")  # a folder link, not followed: no loop
    _sparse(more / "2.png", 2 * MIB)
    assert input_bytes([_folder(photos).pattern, _folder(more, 1).pattern], up_to=10**12) == 5 * MIB


def test_the_user_chooses_by_runner_workers_or_beams_flags():
    assert not chooses_where_it_runs(None, None, [])
    assert chooses_where_it_runs(None, 1, [])
    assert chooses_where_it_runs("dask", None, [])
    assert chooses_where_it_runs(None, None, ["--runner=DataflowRunner"])
    assert chooses_where_it_runs(None, None, ["--direct_num_workers=4"])
    assert chooses_where_it_runs(None, None, ["--direct_running_mode=multi_processing"])
    assert not chooses_where_it_runs(None, None, ["--temp_location=/tmp"])


def _converted(tmp_path, out: pathlib.Path, *extra, capsys) -> str:
    assert cli.main(["convert", str(tmp_path / "photos"), "--output", str(out), *extra]) == 0
    return capsys.readouterr().out


def _shards(folder: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if ".tfrecord-" in p.name}


def test_a_conversion_large_enough_runs_in_worker_processes_with_the_same_bytes(
    tmp_path, monkeypatch, capsys
):
    for index in range(12):
        make_image(tmp_path / "photos" / "cats" / f"{index}.jpg", "JPEG", seed=index)
    chosen_by_hand = _converted(tmp_path, tmp_path / "one" / "out", "--workers", "1", capsys=capsys)
    assert "ran in this process\n" in chosen_by_hand
    # The images' few KiB count as enough for two workers here.
    monkeypatch.setattr(local_workers, "BYTES_PER_WORKER", 1024)
    monkeypatch.setattr(local_workers, "usable_cores", lambda: 2)
    summary = _converted(tmp_path, tmp_path / "auto" / "out", capsys=capsys)
    assert "ran in 2 worker processes (chosen for " in summary, summary
    assert "of input, 2 cores; --workers 1 runs in this process)" in summary, summary
    assert _shards(tmp_path / "auto" / "out") == _shards(tmp_path / "one" / "out")
    # Too little input for two: this process, and the summary says why.
    monkeypatch.setattr(local_workers, "BYTES_PER_WORKER", 10 * MIB)
    summary = _converted(tmp_path, tmp_path / "small" / "out", capsys=capsys)
    assert "ran in this process (chosen for " in summary, summary
    assert "KiB of input; --workers N runs N worker processes)" in summary, summary


def test_a_table_large_enough_runs_in_worker_processes_with_the_same_bytes(
    tmp_path, monkeypatch, capsys
):
    table = tmp_path / "table.csv"
    rows = [f'{i},name {i},{i * 0.5},"a, quoted {i}"' for i in range(3000)]
    table.write_text("id,name,score,note\n" + "\n".join(rows) + "\n")

    def converted(out, *extra):
        assert cli.main(["convert", str(table), "--output", str(out), *extra]) == 0
        return capsys.readouterr().out

    in_process = converted(tmp_path / "one" / "out", "--workers", "1")
    assert "ran in this process\n" in in_process
    monkeypatch.setattr(local_workers, "BYTES_PER_WORKER", table.stat().st_size // 2)
    monkeypatch.setattr(local_workers, "usable_cores", lambda: 2)
    summary = converted(tmp_path / "auto" / "out")
    assert "ran in 2 worker processes (chosen for " in summary, summary
    assert _shards(tmp_path / "auto" / "out") == _shards(tmp_path / "one" / "out")


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(local_workers, "usable_cores", lambda: 2)


def test_the_program_guesses_from_its_arguments_when_the_default_will_choose_workers(
    tmp_path, monkeypatch, two_cores
):
    big, small, output = tmp_path / "big", tmp_path / "small", tmp_path / "out"
    for index in range(2):
        _sparse(big / "class" / f"{index}.jpg", PER_WORKER)
    _sparse(small / "class" / "0.jpg", PER_WORKER)
    _sparse(output / "old.tfrecord", 2 * PER_WORKER)
    guess = command.may_choose_worker_processes
    assert guess(["convert", str(big), "--output", str(output)])
    assert guess(["convert", "--overwrite", str(small), str(big), "-o", str(output)])
    # Too little, or the bytes are the output's.
    assert not guess(["convert", str(small), "--output", str(output)])
    assert not guess(["convert", str(small), "--output", str(big)])
    # The user says where it runs: no guess (--workers N asks by itself).
    for flag in ("--workers=1", "--runner=dask", "--direct_num_workers=1"):
        assert not guess(["convert", str(big), "--output", str(output), flag])
    # Remote inputs run in this process; other commands run no conversion.
    assert not guess(["convert", str(big), "gs://bucket/photos", "--output", str(output)])
    assert not guess(["reshard", str(big), "--output", str(output)])
    monkeypatch.setattr(local_workers, "usable_cores", lambda: 1)
    assert not guess(["convert", str(big), "--output", str(output)])


def test_the_program_guesses_from_csv_tables_too(tmp_path, two_cores):
    big, small, output = tmp_path / "big.csv", tmp_path / "small.csv", tmp_path / "out"
    _sparse(big, 2 * PER_WORKER)
    _sparse(small, PER_WORKER)
    _sparse(tmp_path / "big.csv.gz", 4 * PER_WORKER)
    guess = command.may_choose_worker_processes
    assert guess(["convert", str(big), "--output", str(output)])
    assert guess(["convert", str(small), str(tmp_path / "photos"), "-o", str(output)]) is False
    assert not guess(["convert", str(small), "--output", str(output)])
    assert not guess(["convert", str(tmp_path / "big.csv.gz"), "--output", str(output)])
    assert not guess(["convert", str(big), "--output", str(output), "--workers=1"])
    # A table and a folder: either holding enough is enough.
    for index in range(2):
        _sparse(tmp_path / "photos" / "class" / f"{index}.jpg", PER_WORKER)
    assert guess(["convert", str(small), str(tmp_path / "photos"), "-o", str(output)])
    # The guess is what the choice will be.
    assert local_workers.workers_for_tables([str(big)]) == 2
    assert choose_local_workers([_table(big)]).count == 2


def test_the_guess_counts_what_the_choice_counts(tmp_path, two_cores):
    for index in range(2):
        _sparse(tmp_path / "photos" / "class" / f"{index}.jpg", PER_WORKER)
    _sparse(tmp_path / "photos" / ".cache" / "big.bin", 4 * PER_WORKER)  # hidden: not counted
    for folders in (["photos"], ["photos/class"]):
        paths = [str(tmp_path / folder) for folder in folders]
        chosen = choose_local_workers([_folder(pathlib.Path(p)) for p in paths])
        assert local_workers.workers_for_folders(paths) == chosen.count == 2
    (tmp_path / "photos" / "class" / "1.jpg").unlink()
    assert local_workers.workers_for_folders([str(tmp_path / "photos")]) == 1


def test_the_choice_after_the_programs_guess_does_not_walk_the_folders_again(
    tmp_path, monkeypatch, two_cores
):
    for index in range(3):
        _sparse(tmp_path / "photos" / "class" / f"{index}.jpg", PER_WORKER)
    walked = []
    real_walk = local_workers.walk_pattern

    def counting_walk(pattern):
        walked.append(pattern)
        return real_walk(pattern)

    monkeypatch.setattr(local_workers, "walk_pattern", counting_walk)
    monkeypatch.chdir(tmp_path)
    # As typed on the command line (relative, a trailing slash); the choice sees absolute paths.
    assert local_workers.workers_for_folders(["photos/"], remember=True) == 2
    assert walked == [f"{tmp_path}/photos/**"]
    source = _folder(tmp_path / "photos")
    assert choose_local_workers([source]).count == 2
    assert len(walked) == 1  # the guess's count, taken
    assert choose_local_workers([source]).count == 2
    assert len(walked) == 2  # taken once: a later choice walks again
