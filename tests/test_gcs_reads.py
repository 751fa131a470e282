"""How much of a gs:// image each step downloads, counted by a proxy in front of the emulator.

The header probe (run for every image by `plan` and `convert`) should fetch the header and the
last few bytes, not the file; the shard writer fetches each image once, whole.
"""

from __future__ import annotations

import json
import random
import sys
import uuid

import pytest
from gcs_emulator import EMULATOR, INSTALL_HINT, running_emulator
from gcs_traffic import counting_proxy
from PIL import Image
from test_gcs import assert_same_dataset, download, local_files, upload

from recordforge.transforms.core.errors import InputError
from recordforge.transforms.probe import probe_file

# The probe's first read, and its second when a header needs more (transforms.core.images.probe).
FIRST_READ = 16 * 1024
HEAD_READ = 64 * 1024
# One byte over each read is the reader's (google-cloud-storage asks for an inclusive range one
# byte longer than the read); a few more for the file's last bytes, read to see that it is whole.
SLACK = 64


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """The emulator behind a counting proxy, with this process (and its CLI) pointed at the proxy.

    Yields (the emulator, the proxy's Downloads).
    """
    if not EMULATOR.exists():
        pytest.fail(
            f"gcp-storage-emulator is not installed next to {sys.executable}; {INSTALL_HINT}"
        )
    with (
        running_emulator(tmp_path_factory.mktemp("gcs")) as emulator,
        counting_proxy(emulator.endpoint) as (proxy, downloads),
        pytest.MonkeyPatch.context() as patch,
    ):
        for key, value in {**emulator.env, "STORAGE_EMULATOR_HOST": proxy}.items():
            patch.setenv(key, value)
        yield emulator, downloads


@pytest.fixture
def bucket(gcs):
    emulator, downloads = gcs
    name = f"rf-{uuid.uuid4().hex[:12]}"
    emulator.client().create_bucket(name)
    downloads.clear()
    return name


def noise_image(path, fmt: str, size: tuple[int, int], seed: int, **save) -> int:
    """A picture of random pixels (large once encoded: noise does not compress); its size."""
    pixels = random.Random(seed).randbytes(size[0] * size[1] * 3)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.frombytes("RGB", size, pixels).save(path, fmt, **save)
    return path.stat().st_size


@pytest.fixture(scope="module")
def large_images(tmp_path_factory):
    """photos/<class>/<file>: three photos over 1 MB (one with a 40 KB ICC profile), one small."""
    root = tmp_path_factory.mktemp("large") / "photos"
    noise_image(root / "big" / "noise.jpg", "JPEG", (1600, 1200), seed=1, quality=95)
    noise_image(root / "big" / "noise.png", "PNG", (1000, 800), seed=2)
    profile = random.Random(3).randbytes(40_000)  # its header runs past the first 16 KiB
    noise_image(
        root / "icc" / "profiled.jpg", "JPEG", (1200, 900), seed=4, quality=95, icc_profile=profile
    )
    noise_image(root / "icc" / "small.jpg", "JPEG", (40, 30), seed=5)
    return root


def test_a_probe_downloads_the_header_of_a_large_image_not_the_file(gcs, bucket, large_images):
    emulator, downloads = gcs
    upload(emulator, large_images, bucket, "in")
    limits = {  # what the probe may download, at most
        "big/noise.jpg": FIRST_READ + SLACK,
        "big/noise.png": FIRST_READ + SLACK,
        "icc/profiled.jpg": HEAD_READ + SLACK,  # the header needs the second, larger read
    }
    for name, limit in limits.items():
        local = large_images / name
        assert local.stat().st_size > 1_000_000, "not a large image"
        remote = probe_file(f"gs://{bucket}/in/{name}", max_image_pixels=1 << 30)

        # The same facts; the version is the object's generation there, the file's mtime here.
        assert remote[:5] == probe_file(str(local), max_image_pixels=1 << 30)[:5]
        assert remote.size == local.stat().st_size and remote.version > 0
        fetched = downloads.of(f"{bucket}/in/{name}")
        assert 0 < sum(fetched) <= limit, (name, fetched)


def test_a_small_image_is_fetched_whole_in_one_request(gcs, bucket, tmp_path):
    # Cheaper than a first read and a read of the end: one round trip, no more bytes than a
    # probe whose header needs its second read.
    emulator, downloads = gcs
    sizes = {
        "tiny.png": noise_image(tmp_path / "tiny.png", "PNG", (20, 20), seed=6),
        "mid.jpg": noise_image(tmp_path / "mid.jpg", "JPEG", (150, 100), seed=7, quality=95),
        "photo.jpg": noise_image(tmp_path / "photo.jpg", "JPEG", (400, 300), seed=8, quality=90),
    }
    assert sizes["tiny.png"] < FIRST_READ < sizes["mid.jpg"] < HEAD_READ < sizes["photo.jpg"]
    upload(emulator, tmp_path, bucket, "in")
    for name, size in sizes.items():
        remote = probe_file(f"gs://{bucket}/in/{name}", max_image_pixels=1 << 30)
        assert remote[:5] == probe_file(str(tmp_path / name), max_image_pixels=1 << 30)[:5]
        assert remote.version > 0  # the object's generation
        fetched = downloads.of(f"{bucket}/in/{name}")
        if size <= HEAD_READ:
            assert fetched == [size], name
        else:  # the first read, then the last bytes
            assert len(fetched) == 2 and sum(fetched) <= FIRST_READ + SLACK, (name, fetched)


def test_a_truncated_large_image_is_read_whole_once_and_reported(gcs, bucket, large_images):
    """Only a full decode can tell a truncated image: then the probe reads all of it, once."""
    emulator, downloads = gcs
    data = (large_images / "big" / "noise.jpg").read_bytes()
    cut = data[: len(data) // 2]
    emulator.client().bucket(bucket).blob("cut.jpg").upload_from_string(cut)

    with pytest.raises(InputError) as raised:
        probe_file(f"gs://{bucket}/cut.jpg", max_image_pixels=1 << 30)

    assert raised.value.kind == "TruncatedImage"
    assert len(cut) <= sum(downloads.of(f"{bucket}/cut.jpg")) <= len(cut) + 2 * FIRST_READ


def test_a_probe_of_a_missing_object_is_a_missing_file(gcs, bucket):
    with pytest.raises(InputError) as raised:
        probe_file(f"gs://{bucket}/nowhere.jpg", max_image_pixels=1 << 30)
    assert raised.value.kind == "MissingFile"
    assert raised.value.message == f"file not found: gs://{bucket}/nowhere.jpg"


def test_plan_and_convert_download_each_large_image_once(gcs, bucket, large_images, cli, tmp_path):
    emulator, downloads = gcs
    upload(emulator, large_images, bucket, "in")
    sizes = {
        p.relative_to(large_images).as_posix(): p.stat().st_size
        for p in large_images.rglob("*")
        if p.is_file()
    }
    options = ("--splits", "train=1", "--num-shards", "1")

    planned = cli("plan", f"gs://{bucket}/in", *options, "--json")
    assert planned.returncode == 0, planned.stderr
    local_plan = cli("plan", large_images, *options, "--json")
    assert local_plan.returncode == 0, local_plan.stderr
    plan = json.loads(planned.stdout)
    assert plan["splits"] == json.loads(local_plan.stdout)["splits"]
    assert plan["num_inputs"] == 4 and plan["failed_inputs"] == 0
    for name, size in sizes.items():
        fetched = downloads.of(f"{bucket}/in/{name}")
        if size <= HEAD_READ:
            assert fetched == [size], (name, fetched)  # small: whole, in one request
        else:
            assert 0 < sum(fetched) <= HEAD_READ + SLACK < size, (name, fetched)

    downloads.clear()
    convert = ("convert", "--name", "big", *options)
    converted = cli(*convert, f"gs://{bucket}/in", "-o", f"gs://{bucket}/out")
    assert converted.returncode == 0, converted.stderr
    local = cli(*convert, large_images, "-o", tmp_path / "local")
    assert local.returncode == 0, local.stderr
    assert_same_dataset(download(emulator, bucket, "out"), local_files(tmp_path / "local"))
    for name, size in sizes.items():
        # The probe's pieces, then the writer's one read of the whole file.
        fetched = downloads.of(f"{bucket}/in/{name}")
        assert fetched[-1] == size and sum(fetched[:-1]) <= HEAD_READ + SLACK, (name, fetched)
