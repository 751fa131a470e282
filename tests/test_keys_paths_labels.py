"""Stable keys and splits, source path arithmetic, and label resolution."""

from __future__ import annotations

import collections
import fnmatch
import hashlib

import pytest

from recordforge.transforms.core.files.naming import (
    index_file_name,
    indexed_shard,
    is_dataset_file,
    is_valid_split_name,
    shard_file_name,
    shard_file_pattern,
)
from recordforge.transforms.core.files.paths import (
    glob_root,
    is_csv,
    is_hidden,
    parent_folder,
    relative_path,
    resolve_reference,
)
from recordforge.transforms.core.planning.keys import SplitChooser, hash_of, order_key
from recordforge.transforms.core.planning.labels import LabelTally, resolve_labels


def test_order_key_is_salted():
    assert order_key("a", "k") != order_key("b", "k")
    assert order_key("a", "k").endswith(b"k")
    assert 0 <= hash_of(order_key("a", "k")) < 2**64


def test_order_key_pinned_value():
    # Pinned: a change here reorders (and re-splits) every dataset ever written.
    assert order_key("recordforge", "0:cat/1.jpg").hex() == PINNED_ORDER_KEY


PINNED_ORDER_KEY = "298ad4729f25d766303a6361742f312e6a7067"


def test_split_fractions_are_respected_on_many_keys():
    chooser = SplitChooser((("train", 0.8), ("validation", 0.1), ("test", 0.1)), salt="s")
    counts = collections.Counter(chooser.choose(f"0:img/{i}.jpg") for i in range(20_000))
    assert abs(counts["train"] / 20_000 - 0.8) < 0.015
    assert abs(counts["validation"] / 20_000 - 0.1) < 0.01
    assert abs(counts["test"] / 20_000 - 0.1) < 0.01


def test_split_choice_is_the_salted_blake2b_of_the_key():
    """The split hash, keyed once and copied per key, is BLAKE2b keyed with b"split\\0" + salt."""
    chooser = SplitChooser((("train", 0.5), ("test", 0.5)), salt="s")
    for i in range(200):
        key = f"0:cat/{i}-ü.jpg"
        digest = hashlib.blake2b(key.encode(), digest_size=8, key=b"split\0s").digest()
        expected = "train" if int.from_bytes(digest, "big") < 2**63 else "test"
        assert chooser.choose(key) == expected


def test_one_split_takes_every_key():
    chooser = SplitChooser((("all", 1.0),), salt="s")
    assert {chooser.choose(f"0:{i}") for i in range(100)} == {"all"}


def test_split_choice_depends_only_on_key_and_salt():
    a = SplitChooser((("train", 0.5), ("test", 0.5)), salt="s")
    b = SplitChooser((("train", 0.5), ("test", 0.5)), salt="s")
    c = SplitChooser((("train", 0.5), ("test", 0.5)), salt="other")
    keys = [f"k{i}" for i in range(200)]
    assert [a.choose(k) for k in keys] == [b.choose(k) for k in keys]
    assert [a.choose(k) for k in keys] != [c.choose(k) for k in keys]


@pytest.mark.parametrize(
    "fractions", [(), (("a", 0.5),), (("a", 0.5), ("b", 0.6)), (("a", 0.0), ("b", 1.0))]
)
def test_bad_fractions(fractions):
    with pytest.raises(ValueError):
        SplitChooser(fractions, salt="s")


def test_shard_names_follow_tfds():
    assert shard_file_name("ds", "train", 3, 12, "none") == "ds-train.tfrecord-00003-of-00012"
    assert shard_file_name("ds", "test", 0, 1, "gzip") == "ds-test.tfrecord-00000-of-00001.gz"
    match = shard_file_pattern("ds").match("ds-train.tfrecord-00003-of-00012")
    assert match and match["split"] == "train" and match["count"] == "00012"
    with pytest.raises(ValueError):
        shard_file_name("ds", "train", 12, 12, "none")


def test_index_files_live_in_their_own_folder_out_of_the_shard_glob():
    shard = shard_file_name("ds", "train", 3, 12, "none")
    index = index_file_name(shard)
    assert index == "index/ds-train.tfrecord-00003-of-00012.idx"
    natural = "ds-train.tfrecord-*-of-*"  # the glob a user writes for the shards
    assert fnmatch.fnmatch(shard, natural) and not fnmatch.fnmatch(index, natural)
    assert indexed_shard(index) == shard
    assert indexed_shard(shard + ".idx") == shard  # the top-level place of earlier versions
    assert indexed_shard("index/notes.idx") is None and indexed_shard("other/" + shard) is None
    assert indexed_shard("sub/index/" + shard + ".idx") is None
    # What --overwrite may delete: both places, not anything else in index/.
    assert is_dataset_file(index) and is_dataset_file(shard + ".idx")
    assert not is_dataset_file("index/notes.txt") and not is_dataset_file("index/x.idx")


@pytest.mark.parametrize(
    ("name", "ok"), [("train", True), ("val-1", True), ("a.b", False), ("", False), ("x y", False)]
)
def test_split_names(name, ok):
    assert is_valid_split_name(name) is ok


def test_paths():
    assert glob_root("/data/photos/*/*.jpg") == "/data/photos"
    assert glob_root("gs://b/x/**/*.png") == "gs://b/x"
    assert relative_path("/data/photos/cat/1.jpg", "/data/photos") == "cat/1.jpg"
    assert relative_path("gs://b/x/cat/1.jpg", "gs://b/x/") == "cat/1.jpg"
    assert is_hidden(".DS_Store") and is_hidden("cat/._1.jpg") and is_hidden(".git/objects/ab")
    assert not is_hidden("cat/1.jpg")
    assert is_csv("a/B.CSV") and is_csv("x.csv.gz") and not is_csv("x.jpg")
    assert resolve_reference("imgs/1.jpg", "/data") == "/data/imgs/1.jpg"
    assert resolve_reference("/abs/1.jpg", "/data") == "/abs/1.jpg"
    assert resolve_reference("gs://b/1.jpg", "/data") == "gs://b/1.jpg"


def test_references_against_a_bucket_folder_resolve_dot_segments_as_urls_do():
    # An object store has no folders to resolve ".." in: "file not found: gs://b/t/../i/x.jpg".
    assert resolve_reference("../img/x.jpg", "gs://b/tables") == "gs://b/img/x.jpg"
    assert resolve_reference("./x.jpg", "gs://b/tables/") == "gs://b/tables/x.jpg"
    assert resolve_reference("a/./b/../x.jpg", "gs://b/t") == "gs://b/t/a/x.jpg"
    assert resolve_reference("../../../x.jpg", "gs://b/t") == "gs://b/x.jpg"  # not above it
    assert resolve_reference("a//x.jpg", "gs://b/t") == "gs://b/t/a//x.jpg"  # a valid name
    # Locally the system resolves them, through symbolic links.
    assert resolve_reference("../img/x.jpg", "/data/tables") == "/data/tables/../img/x.jpg"
    assert parent_folder("gs://b/x/y.csv") == "gs://b/x"
    assert parent_folder("/data/y.csv") == "/data"


def _tally(files_by_source):
    tally = LabelTally()
    for source, relatives in files_by_source.items():
        for relative in relatives:
            depth = relative.count("/")
            tally.add(source, depth, relative.split("/")[0] if depth else None)
    return tally


def test_auto_labels_from_class_folders():
    tally = _tally({0: ["dog/1.jpg", "cat/2.jpg", "cat/3.jpg"]})
    labels = resolve_labels(tally, [0], [], "auto", csv_labelled=False)
    assert labels.names == ("cat", "dog")
    assert labels.id_of("dog") == 1
    assert labels.labelled_sources == {0}


def test_auto_labels_off_for_flat_or_nested_folders():
    for files in (["1.jpg", "2.jpg"], ["2023/01/1.jpg", "2023/02/2.jpg"], ["cat/1.jpg", "x.jpg"]):
        labels = resolve_labels(_tally({0: files}), [0], [], "auto", csv_labelled=False)
        assert labels.names == () and not labels.labelled_sources
        assert "--labels folder" in labels.note


def test_folder_mode_takes_first_level_and_union_over_sources():
    tally = _tally({0: ["2023/01/1.jpg"], 1: ["cat/1.jpg"]})
    labels = resolve_labels(tally, [0, 1], [], "folder", csv_labelled=False)
    assert labels.names == ("2023", "cat")
    assert resolve_labels(tally, [0, 1], [], "none", csv_labelled=False).names == ()


def test_tallies_merge():
    a, b = _tally({0: ["cat/1.jpg"]}), _tally({0: ["dog/1.jpg"], 1: ["x.jpg"]})
    merged = a.merge(b)
    assert merged.depths == {0: (0, 2, 0), 1: (1, 0, 0)}  # (in the root, one down, deeper)
    assert merged.names == {0: {"cat", "dog"}}
