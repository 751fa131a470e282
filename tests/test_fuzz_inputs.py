"""Fuzzing hostile inputs (issue 15): CSV bytes and image bytes, mutated from valid files, cut
at every offset, or of random structure.

The invariants: reading ends (no hang), with a result or one of the errors meant for bad input
(never another exception, never a traceback); what is accepted adds up (a CSV's rows are all
there, `num_inputs == num_records + errors.count`); every image accepted decodes with
TensorFlow, to the size and channels the record says. A few cases run by default; the long
runs are `-m slow` (their figures are in the README, "Reliability").
"""

from __future__ import annotations

import io
import json
import random

import pytest
from conftest import make_image, read_errors, run_cli
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from recordforge.schemas.csv.schema import ColumnSpec, CsvSchema
from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.images.integrity import check_structure
from recordforge.transforms.core.images.probe import probe_image_bytes
from recordforge.transforms.core.tables.rows import CsvEnd, read_csv_rows
from recordforge.transforms.core.tables.stream import CsvReadFailure

QUICK = settings(
    max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)
LONG = settings(
    max_examples=5000,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.generate],
)

# --- CSV ---------------------------------------------------------------------------------------

SCHEMA = CsvSchema(
    (
        ColumnSpec("id", "id", "int64"),
        ColumnSpec("x", "x", "float"),
        ColumnSpec("name", "name", "bytes"),
        ColumnSpec("tags", "tags", "int64", is_list=True),
    )
)
VALID_ROWS = [
    b'%d,%d.5,"name, %d\n""quoted""",1;%d\n' % (i, i, i, i)
    if i % 3 == 0
    else b"%d,%d,n%d,\n" % (i, i, i)
    for i in range(1, 40)
]
VALID_CSV = b"id,x,name,tags\n" + b"".join(VALID_ROWS)
_CSV_ALPHABET = [b'"', b",", b"\n", b"\r", b";", b"\x00", b"\xff", b"a", b"1", b"\xef\xbb\xbf"]


@st.composite
def mutated_csv(draw, base: bytes = VALID_CSV) -> bytes:
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(["insert", "delete", "replace", "cut"]))
        piece = draw(st.sampled_from(_CSV_ALPHABET)) * draw(st.integers(1, 3))
        if action == "insert":
            data[at:at] = piece
        elif action == "delete":
            del data[at : at + draw(st.integers(1, 20))]
        elif action == "replace":
            data[at : at + len(piece)] = piece
        else:
            del data[at:]
    return bytes(data)


_RANDOM_CSV = st.lists(
    st.sampled_from([b"id,x,name,tags\n", *_CSV_ALPHABET, b"12", b"3.5", b"\r\n", b'""']),
    max_size=60,
).map(b"".join)


# A row with the wrong number of fields is an error of its own: it never refuses or stops the
# file (pyarrow did so when the row was not UTF-8).
_PYARROW_STOPS = ("columns, got", "pyarrow's reader cannot skip")


def _read_csv(data: bytes, items_out: list | None = None) -> str:
    """How reading `data` ends: "rows" (read to its end), "file" (one error for the file),
    or "stopped" (it cannot be read to its end). Any other exception fails the test."""
    try:
        *items, end = read_csv_rows(io.BytesIO(data), SCHEMA, source_name="f.csv", block_size=64)
    except InputError as error:
        assert not any(stop in str(error) for stop in _PYARROW_STOPS), error
        return "file"
    except CsvReadFailure as failure:
        # The scanner and pyarrow must never disagree on how many rows there are.
        assert "where the file holds" not in failure.reason, failure.reason
        assert not any(stop in failure.reason for stop in _PYARROW_STOPS), failure.reason
        return "stopped"
    assert isinstance(end, CsvEnd) and end.rows == len(items)
    assert [item.row for item in items] == list(range(1, len(items) + 1))
    if items_out is not None:
        items_out.extend(items)
    return "rows"


# Bytes that are not UTF-8 (alone, or a sequence cut short), text, and a quoted field.
_UNDECODABLE_FIELDS = [b"\xff", b"\xe9t\xe9", b"\xc3", b"\xe2\x82", b"a", b"7", b'"\xfe,\n"']


@st.composite
def csv_with_undecodable_rows(draw) -> tuple[bytes, list[int]]:
    """VALID_CSV with rows inserted that have the wrong number of fields and bytes that are not
    UTF-8; returns the file and the rows they are (1-based)."""
    rows = list(VALID_ROWS)
    bad_rows = []
    for _ in range(draw(st.integers(1, 4))):
        count = draw(st.sampled_from([1, 2, 3, 5, 6]))  # the schema has 4
        fields = [draw(st.sampled_from(_UNDECODABLE_FIELDS)) for _ in range(count)]
        fields[0] = b"\xff"  # one at least
        at = draw(st.integers(0, len(rows)))
        rows.insert(at, b",".join(fields) + draw(st.sampled_from([b"\n", b"\r\n"])))
        bad_rows = [row + (row > at) for row in bad_rows] + [at + 1]
    return b"id,x,name,tags\n" + b"".join(rows), sorted(bad_rows)


@QUICK
@given(mutated_csv())
def test_mutated_csv_files_are_read_or_refused_with_their_reason(data):
    _read_csv(data)


@QUICK
@given(_RANDOM_CSV)
def test_csv_bytes_of_random_structure_are_read_or_refused_with_their_reason(data):
    _read_csv(data)


@QUICK
@given(csv_with_undecodable_rows())
def test_rows_with_the_wrong_field_count_and_bytes_not_utf8_are_errors_of_their_own(case):
    data, bad_rows = case
    items: list = []
    assert _read_csv(data, items) == "rows"
    assert len(items) == len(VALID_ROWS) + len(bad_rows)
    errors = [(item.row, item.error.kind) for item in items if hasattr(item, "error")]
    assert errors == [(row, "WrongFieldCount") for row in bad_rows]


def test_a_csv_cut_at_every_offset_is_read_or_refused_with_its_reason():
    outcomes = {_read_csv(VALID_CSV[:cut]) for cut in range(len(VALID_CSV) + 1)}
    assert outcomes == {"rows", "file", "stopped"}  # cut in a quote: stopped, naming it


@pytest.mark.slow
@LONG
@given(st.one_of(mutated_csv(), _RANDOM_CSV, csv_with_undecodable_rows().map(lambda c: c[0])))
def test_many_csv_files(data):
    _read_csv(data)


# --- images ------------------------------------------------------------------------------------


def _seeds(tmp_path_factory) -> list[bytes]:
    folder = tmp_path_factory.mktemp("seeds")
    cases = [
        ("JPEG", "RGB", {}),
        ("JPEG", "RGB", {"progressive": True}),
        ("JPEG", "L", {}),
        ("PNG", "RGB", {}),
        ("PNG", "RGBA", {"interlace": 1}),
        ("GIF", "P", {}),
        ("BMP", "RGB", {}),
        ("WEBP", "RGB", {}),
        ("WEBP", "RGBA", {"lossless": True}),
    ]
    return [
        make_image(folder / f"{i}.{fmt.lower()}", fmt, size=(48, 36), mode=mode, seed=i, **kw)
        for i, (fmt, mode, kw) in enumerate(cases)
    ]


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    return _seeds(tmp_path_factory)


@st.composite
def mutation(draw):
    """How to damage a file: (kind, where as a fraction, how much, random seed)."""
    kind = draw(st.sampled_from(["flip", "random", "ff", "zero", "delete", "insert", "cut"]))
    return kind, draw(st.floats(0, 1)), draw(st.integers(1, 600)), draw(st.integers(0, 2**32))


def mutate(data: bytes, change) -> bytes:
    kind, where, size, seed = change
    rng = random.Random(seed)
    at = min(int(where * len(data)), len(data) - 1)
    out = bytearray(data)
    if kind == "flip":
        for _ in range(1 + size % 8):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    elif kind in ("random", "ff", "zero"):
        fill = {"random": rng.randbytes(size), "ff": b"\xff" * size, "zero": bytes(size)}[kind]
        out[at : at + size] = fill[: len(out) - at]
    elif kind == "delete":
        del out[at : at + size]
    elif kind == "insert":
        out[at:at] = rng.randbytes(size)
    else:
        del out[at:]
    return bytes(out)


def _judge(data: bytes, tf) -> str:
    """ "refused" (an InputError) or "accepted" (then TensorFlow must decode it to the size and
    channels the probe found). Any other exception fails the test."""
    try:
        facts = probe_image_bytes(data)
        check_structure(data)  # what the writer checks before writing a record
    except InputError:
        return "refused"
    decoded = tf.io.decode_image(data, expand_animations=False)
    assert tuple(decoded.shape) == (facts.height, facts.width, facts.channels)
    return "accepted"


@QUICK
@given(index=st.integers(0, 8), change=mutation())
def test_mutated_images_are_refused_or_decode_with_tensorflow(seeds, tf, index, change):
    _judge(mutate(seeds[index], change), tf)


@pytest.mark.parametrize("index", range(9))
def test_images_cut_at_every_offset_are_refused_or_decode_with_tensorflow(seeds, tf, index):
    data = seeds[index]
    outcomes = [_judge(data[:cut], tf) for cut in range(len(data) + 1)]
    assert outcomes[-1] == "accepted" and outcomes[0] == "refused"


@QUICK
@given(st.binary(max_size=400), st.sampled_from([b"", b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n"]))
def test_random_bytes_behind_an_image_signature_are_refused_or_decode(tf, body, signature):
    _judge(signature + body, tf)


@pytest.mark.slow
@LONG
@given(index=st.integers(0, 8), change=mutation())
def test_many_mutated_images(seeds, tf, index, change):
    _judge(mutate(seeds[index], change), tf)


# --- whole runs ----------------------------------------------------------------------------------


def _run_and_check(args, out, tf) -> dict:
    """A conversion's invariants: it ends with 0 (a dataset) or 1 (refused, one line, no
    dataset), never a traceback; what it wrote adds up and decodes."""
    result = run_cli("convert", *args, "-o", out, timeout=900)
    assert result.returncode in (0, 1), result.stderr
    assert "Traceback" not in result.stderr
    if result.returncode == 1:
        assert result.stderr.strip().splitlines()[-1].startswith("recordforge: failed: ")
        assert not (out / "dataset_info.json").exists()
        return {}
    manifest = json.loads((out / "dataset_info.json").read_text())
    assert manifest["num_inputs"] == manifest["num_records"] + manifest["errors"]["count"]
    assert len(read_errors(out)) == manifest["errors"]["count"]
    assert run_cli("verify", out).returncode == 0
    from recordforge import iterate

    for split in manifest["splits"]:
        for record in iterate(str(out), split):
            if "image/encoded" in record:
                decoded = tf.io.decode_image(record["image/encoded"][0], expand_animations=False)
                assert decoded.shape[0] == record["image/height"][0]
                assert decoded.shape[1] == record["image/width"][0]
                assert decoded.shape[2] == record["image/channels"][0]
    return manifest


def _fuzzed_folder(root, seeds, rng: random.Random, count: int) -> None:
    for i in range(count):
        seed = rng.choice(seeds)
        change = (
            rng.choice(["flip", "random", "ff", "zero", "delete", "insert", "cut"]),
            rng.random(),
            rng.randint(1, 600),
            rng.getrandbits(32),
        )
        data = mutate(seed, change) if rng.random() < 0.8 else seed
        folder = root / f"class{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i}.img").write_bytes(data)


def _fuzzed_tables(root, rng: random.Random, count: int) -> None:
    root.mkdir(parents=True)
    (root / "a.csv").write_bytes(VALID_CSV)  # the schema's: the rest are read by it
    for i in range(count):
        data = bytearray(VALID_CSV)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data))
            data[at:at] = rng.choice(_CSV_ALPHABET)
        (root / f"t{i}.csv").write_bytes(bytes(data))


@pytest.mark.parametrize("seed", [1])
def test_whole_runs_over_fuzzed_images_and_tables_keep_the_invariants(tmp_path, seeds, tf, seed):
    rng = random.Random(seed)
    _fuzzed_folder(tmp_path / "images", seeds, rng, 40)
    manifest = _run_and_check([str(tmp_path / "images")], tmp_path / "images-out", tf)
    assert manifest["num_inputs"] == 40
    _fuzzed_tables(tmp_path / "tables", rng, 6)
    _run_and_check([f"{tmp_path / 'tables'}/*.csv"], tmp_path / "tables-out", tf)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 22))
def test_many_whole_runs(tmp_path, seeds, tf, seed):
    rng = random.Random(seed)
    _fuzzed_folder(tmp_path / "images", seeds, rng, 60)
    manifest = _run_and_check([str(tmp_path / "images")], tmp_path / "images-out", tf)
    assert manifest["num_inputs"] == 60
    _fuzzed_tables(tmp_path / "tables", rng, 8)
    _run_and_check([f"{tmp_path / 'tables'}/*.csv"], tmp_path / "tables-out", tf)
