"""Shared fixtures: generated image folders (good and bad files), the CLI, an independent reader."""

from __future__ import annotations

import ipaddress
import json
import os
import pathlib
import random
import struct
import subprocess
import sys
import uuid
import zlib
from collections.abc import Callable

import pytest
from gcs_emulator import EMULATOR, INSTALL_HINT, running_emulator
from PIL import Image, ImageDraw

RECORDFORGE = str(pathlib.Path(sys.executable).with_name("recordforge"))


@pytest.fixture(scope="session", autouse=True)
def _beam_temp_folders_removed():
    """Beam makes a `beam-pipeline-temp*` folder for every Pipeline and removes it when the
    pipeline runs: the tests' pipelines refused before they run (a WriteDataset refused when
    applied) would leave theirs in /tmp. Those this test process made are removed at its end
    (another process's, a concurrent run's, are not touched)."""
    import shutil
    import tempfile

    made = []
    original = tempfile.mkdtemp

    def mkdtemp(*args, **kwargs):
        folder = original(*args, **kwargs)
        if os.path.basename(folder).startswith("beam-pipeline-temp"):
            made.append(folder)
        return folder

    tempfile.mkdtemp = mkdtemp
    yield
    tempfile.mkdtemp = original
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


def make_image(path: pathlib.Path, fmt: str, size=(64, 48), mode="RGB", seed=0, **save) -> bytes:
    """Write a small picture (not a flat colour, so JPEG sizes vary) and return its bytes."""
    rng = random.Random(seed)
    image = Image.new("RGB", size, tuple(rng.randint(0, 255) for _ in range(3)))
    draw = ImageDraw.Draw(image)
    for _ in range(6):
        x0, y0 = rng.randint(0, size[0] - 2), rng.randint(0, size[1] - 2)
        box = (x0, y0, rng.randint(x0 + 1, size[0]), rng.randint(y0 + 1, size[1]))
        draw.rectangle(box, fill=tuple(rng.randint(0, 255) for _ in range(3)))
    if mode != "RGB":
        image = image.convert(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, fmt, **save)
    return path.read_bytes()


def png_bomb(path: pathlib.Path, width=40_000, height=40_000) -> None:
    """A valid small PNG whose header claims width×height pixels (a decompression bomb)."""
    make_image(path, "PNG", size=(8, 8))
    data = bytearray(path.read_bytes())
    # IHDR data starts at byte 16 (8-byte signature, 4-byte length, 4-byte type).
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    path.write_bytes(bytes(data))


GOOD_IMAGES = {
    # relative path: (Pillow format, size, mode)
    "cat/c1.jpg": ("JPEG", (64, 48), "RGB"),
    "cat/c2.jpg": ("JPEG", (120, 80), "L"),
    "cat/c3.png": ("PNG", (33, 77), "RGBA"),
    "cat/c4.gif": ("GIF", (40, 40), "P"),
    "dog/d1.jpg": ("JPEG", (200, 150), "RGB"),
    "dog/d2.bmp": ("BMP", (31, 17), "RGB"),
    "dog/d3.webp": ("WEBP", (50, 60), "RGB"),
    "dog/png-named.jpg": ("PNG", (21, 22), "RGB"),  # the format comes from the bytes
    "eel/e1.jpg": ("JPEG", (90, 91), "RGB"),
    "eel/e2.png": ("PNG", (64, 64), "L"),
}
BAD_FILES = {
    # relative path: the error kind expected in the quarantine
    "cat/corrupt.jpg": "NotAnImage",
    "dog/truncated.jpg": "TruncatedImage",
    "dog/empty.png": "EmptyFile",
    "eel/notes.txt": "NotAnImage",
    "eel/bomb.png": "DecompressionBomb",
}


@pytest.fixture
def photo_folder(tmp_path) -> pathlib.Path:
    """root/<class>/<file>: 10 good images of five formats, 5 bad files, 2 hidden files."""
    root = tmp_path / "photos"
    for index, (relative, (fmt, size, mode)) in enumerate(sorted(GOOD_IMAGES.items())):
        make_image(root / relative, fmt, size=size, mode=mode, seed=index)
    (root / "cat/corrupt.jpg").write_bytes(
        bytes(random.Random(1).randrange(256) for _ in range(3000))
    )
    whole = make_image(tmp_path / "whole.jpg", "JPEG", size=(300, 200), seed=99)
    (root / "dog/truncated.jpg").write_bytes(whole[: len(whole) // 2])
    (root / "dog/empty.png").write_bytes(b"")
    (root / "eel/notes.txt").write_text("these are notes, not a picture\n")
    png_bomb(root / "eel/bomb.png")
    (root / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (root / "cat/._c1.jpg").write_bytes(b"\0\5\26\7")
    return root


@pytest.fixture
def many_images(tmp_path) -> pathlib.Path:
    """root/<class>/<file>: 240 JPEGs of varied sizes (about 2–40 KB) in 4 classes."""
    root = tmp_path / "many"
    rng = random.Random(7)
    for index in range(240):
        size = (rng.randint(40, 400), rng.randint(40, 300))
        make_image(
            root / f"class{index % 4}" / f"img{index:04d}.jpg", "JPEG", size=size, seed=index
        )
    return root


@pytest.fixture(scope="session")
def tf():
    """TensorFlow, imported only by the tests that compare with it (the import takes seconds)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow

    return tensorflow


def run_cli(*args: str, cwd=None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run the installed `recordforge` command; returns the finished process (text output)."""
    return subprocess.run(
        [RECORDFORGE, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess]:
    return run_cli


def read_dataset(out: pathlib.Path) -> tuple[dict, dict[str, list[dict]]]:
    """Read every record back with tf.data + tf.io.parse_example, the spec from the manifest.

    Returns the manifest and, per split, the records as {feature: numpy value} dicts in file
    order (VarLen features as lists).
    """
    import tensorflow as tf

    info = json.loads((out / "dataset_info.json").read_text())
    dtypes = {"int64": tf.int64, "float": tf.float32, "bytes": tf.string}
    spec = {}
    for key, feature in info["features"].items():
        if -1 in feature["shape"]:
            spec[key] = tf.io.VarLenFeature(dtypes[feature["dtype"]])
        else:
            spec[key] = tf.io.FixedLenFeature(feature["shape"], dtypes[feature["dtype"]])
    compression = "GZIP" if info["compression"] == "gzip" else None
    splits = {}
    for name, split in info["splits"].items():
        files = [str(out / shard["file"]) for shard in split["shards"]]
        records = []
        if files:
            dataset = tf.data.TFRecordDataset(files, compression_type=compression).batch(64)
            for batch in dataset.map(lambda x: tf.io.parse_example(x, spec)):
                size = int(tf.shape(next(iter(batch.values())))[0]) if spec else 0
                for i in range(size):
                    record = {}
                    for key, value in batch.items():
                        if isinstance(value, tf.sparse.SparseTensor):
                            row = tf.sparse.to_dense(
                                tf.sparse.slice(value, [i, 0], [1, value.dense_shape[1]])
                            )
                            record[key] = list(row.numpy()[0][: _row_length(value, i)])
                        else:
                            record[key] = value[i].numpy()
                    records.append(record)
        splits[name] = records
    return info, splits


def _row_length(sparse, row: int) -> int:
    indices = sparse.indices.numpy()
    return int((indices[:, 0] == row).sum())


def read_errors(out: pathlib.Path) -> list[dict]:
    lines = []
    for path in sorted((out / "errors").glob("*.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return lines


def shard_files(out: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in out.iterdir() if ".tfrecord-" in p.name and p.suffix != ".idx")


def is_loopback(ip: str) -> bool:
    """Whether a listening address accepts connections from this machine only."""
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a dual-stack socket
    return (mapped or address).is_loopback


# --- Cloud Storage: an emulator on 127.0.0.1 (tests/gcs_emulator.py) ----------------------------


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """The emulator, with this process (and so the CLI it starts) pointed at it; one per test
    module (tests/test_gcs_reads.py puts a counting proxy in front of its own)."""
    if not EMULATOR.exists():
        pytest.fail(
            f"gcp-storage-emulator is not installed next to {sys.executable}; {INSTALL_HINT}"
        )
    with (
        running_emulator(tmp_path_factory.mktemp("gcs")) as emulator,
        pytest.MonkeyPatch.context() as patch,
    ):
        for key, value in emulator.env.items():
            patch.setenv(key, value)
        yield emulator


@pytest.fixture
def bucket(gcs):
    """A fresh bucket in the emulator; its name."""
    name = f"rf-{uuid.uuid4().hex[:12]}"
    gcs.client().create_bucket(name)
    return name


# --- A real browser for the --html page ---------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not pathlib.Path(binary).exists():
            pytest.fail(f"{binary} is missing: run `make browser` to install Chromium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def open_page(driver, page: pathlib.Path) -> None:
    driver.get(page.as_uri())
    assert driver.execute_script("return document.readyState") == "complete"
