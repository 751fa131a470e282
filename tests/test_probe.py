"""The probe DoFn: local files one after another, remote ones several at a time, same answers."""

from __future__ import annotations

import gc
import threading
import warnings

import apache_beam as beam
import pytest
from conftest import make_image

import recordforge.transforms.probe as probe
from recordforge.transforms.core.records import STAGE_PROBE, Candidate, ErrorRecord


def _candidates(tmp_path):
    """Good images, a missing file, a non-image, a CSV row naming an image, and a text row."""
    make_image(tmp_path / "a.png", "PNG", size=(30, 20))
    make_image(tmp_path / "b.jpg", "JPEG", size=(10, 40), mode="L")
    (tmp_path / "c.png").write_bytes(b"not an image at all")
    names = ["a.png", "missing.png", "b.jpg", "c.png", "a.png"]
    candidates = [
        Candidate(key=f"0:{n}#{i}", path=str(tmp_path / n), row=None, image_path=str(tmp_path / n))
        for i, n in enumerate(names)
    ]
    candidates[4] = candidates[4]._replace(row=7, path=str(tmp_path / "t.csv"), image_name="a.png")
    candidates.append(Candidate(key="0:t.csv#8", path=str(tmp_path / "t.csv"), row=8))
    return [tuple(c) for c in candidates]


def _run(batch):
    fn = probe._ProbeImageFn(max_image_pixels=1 << 30)
    fn.setup()
    try:
        outputs = list(fn.process(batch))
    finally:
        fn.teardown()
    errors = [o.value for o in outputs if isinstance(o, beam.pvalue.TaggedOutput)]
    probed = [o for o in outputs if not isinstance(o, beam.pvalue.TaggedOutput)]
    return probed, errors, fn


def test_probed_in_order_with_errors_routed(tmp_path) -> None:
    batch = _candidates(tmp_path)
    probed, errors, fn = _run(batch)

    (records,) = probed
    a, b = (tmp_path / "a.png").stat(), (tmp_path / "b.jpg").stat()
    # The version field tells a file rewritten before it is written: its modification time.
    # source_size is -1: no preprocessing, so the size above is the file's own; nor is the
    # EXIF orientation read (1, the last).
    assert [(packed[0], info) for packed, info in records] == [
        ("0:a.png#0", (a.st_size, "png", 30, 20, 3, a.st_mtime_ns, -1, 1)),
        ("0:b.jpg#2", (b.st_size, "jpeg", 10, 40, 1, b.st_mtime_ns, -1, 1)),
        ("0:a.png#4", (a.st_size, "png", 30, 20, 3, a.st_mtime_ns, -1, 1)),
        ("0:t.csv#8", None),
    ]
    assert [(e.path, e.row, e.stage, e.error) for e in errors] == [
        (str(tmp_path / "missing.png"), None, STAGE_PROBE, "MissingFile"),
        (str(tmp_path / "c.png"), None, STAGE_PROBE, "NotAnImage"),
    ]
    assert all(isinstance(e, ErrorRecord) for e in errors)
    assert fn._pool is None, "local files need no threads"


def test_remote_files_are_probed_concurrently_with_the_same_answers(tmp_path, monkeypatch) -> None:
    """Paths with a scheme go through the thread pool (and Beam FileSystems): local files
    stand in for them here, read through Beam's LocalFileSystem."""
    batch = _candidates(tmp_path)
    local = _run(batch)[:2]
    seen_threads = set()
    real_probe_file = probe.probe_file

    def probe_file(path, max_image_pixels, opened=None, allowed_roots=(), **options):
        seen_threads.add(threading.current_thread().name)
        return real_probe_file(path, max_image_pixels, opened, allowed_roots, **options)

    monkeypatch.setattr(probe, "has_scheme", lambda path: True)
    monkeypatch.setattr(probe, "probe_file", probe_file)
    probed, errors, fn = _run(batch)

    def without_versions(probed):  # read through Beam FileSystems: no modification time
        return [[(packed, info and info[:5]) for packed, info in batch] for batch in probed]

    assert (without_versions(probed), errors) == (without_versions(local[0]), local[1])
    assert all(info[5] == -1 for packed, info in probed[0] if info)
    assert fn._pool is not None
    assert seen_threads and all(name.startswith("probe") for name in seen_threads)


def test_an_unexpected_error_in_a_remote_probe_propagates(tmp_path, monkeypatch) -> None:
    def broken(path, max_image_pixels, opened=None, allowed_roots=(), **options):
        raise RuntimeError("storage outage")

    monkeypatch.setattr(probe, "has_scheme", lambda path: True)
    monkeypatch.setattr(probe, "probe_file", broken)
    with pytest.raises(RuntimeError, match="storage outage"):
        _run(_candidates(tmp_path))


def test_local_files_opened_ahead_are_probed_in_order_and_all_closed(tmp_path) -> None:
    # More files than are opened ahead, with a broken link, a folder and a file that changes
    # after it was opened ahead: each answer belongs to its own file, in order.
    sizes = []
    names = []
    for i in range(2 * probe.LOCAL_PROBES_AHEAD + 3):
        name = f"{i:03d}.png"
        make_image(tmp_path / name, "PNG", size=(10 + i, 5))
        names.append(name)
        sizes.append((tmp_path / name).stat().st_size)
    (tmp_path / "broken.png").symlink_to(tmp_path / "gone.png")
    (tmp_path / "folder.png").mkdir()
    names[5:5] = ["broken.png", "folder.png"]
    sizes[5:5] = [None, None]
    batch = [
        tuple(
            Candidate(key=f"0:{n}", path=str(tmp_path / n), row=None, image_path=str(tmp_path / n))
        )
        for n in names
    ]
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always", ResourceWarning)
        probed, errors, _ = _run(batch)
        gc.collect()
    assert [w for w in warned if issubclass(w.category, ResourceWarning)] == []

    (records,) = probed
    good = [(n, s) for n, s in zip(names, sizes, strict=True) if s is not None]
    assert [(packed[0], info[0], info[2]) for packed, info in records] == [
        (f"0:{n}", size, 10 + int(n[:3])) for n, size in good
    ]
    assert [(e.path, e.error) for e in errors] == [
        (str(tmp_path / "broken.png"), "MissingFile"),
        (str(tmp_path / "folder.png"), "NotARegularFile"),  # a folder is never opened
    ]
    assert "broken symbolic link" in errors[0].message


def test_an_unexpected_error_leaves_no_local_file_open(tmp_path, monkeypatch) -> None:
    for i in range(probe.LOCAL_PROBES_AHEAD + 4):
        make_image(tmp_path / f"{i}.png", "PNG", size=(4, 4))
    batch = [
        tuple(Candidate(key=f"0:{i}", path=str(p), row=None, image_path=str(p)))
        for i, p in enumerate(sorted(tmp_path.iterdir()))
    ]

    def fails(*_args, **_kwargs):
        raise RuntimeError("a bug, not a bad input")

    monkeypatch.setattr(probe, "probe_image", fails)
    # A file left open would be closed when collected, with a ResourceWarning.
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(RuntimeError, match="a bug"):
            _run(batch)
        gc.collect()
    assert [w for w in warned if issubclass(w.category, ResourceWarning)] == []


def test_a_link_whose_target_cannot_be_read_is_a_missing_file(tmp_path, monkeypatch) -> None:
    # A link the kernel makes (/proc/N/exe of a kernel thread) cannot be opened, and readlink
    # fails on it too: the message's readlink raised again, a traceback that ended the run.
    from recordforge.transforms.core.errors import InputError

    link = tmp_path / "exe"
    link.symlink_to(tmp_path / "gone")

    def unreadable(path, *args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(probe.os, "readlink", unreadable)
    with pytest.raises(InputError) as refused:
        probe.probe_file(str(link), 10_000)
    assert refused.value.kind == "MissingFile"
    assert "broken symbolic link" in refused.value.message


@pytest.mark.parametrize("code", ["EMFILE", "ENFILE"])
def test_a_limit_of_the_process_is_not_taken_for_a_bad_input(tmp_path, monkeypatch, code) -> None:
    # Too many open files while probing one image made it an UnreadableFile error record: a
    # good input quarantined, the run committed without it (a tester's finding).
    import errno

    from recordforge.transforms.core.errors import InputError

    image = tmp_path / "a.jpg"
    make_image(image, "JPEG")

    def limited(path, *args, **kwargs):
        raise OSError(getattr(errno, code), "a limit of the process", path)

    monkeypatch.setattr(probe, "open_regular", limited)
    with pytest.raises(OSError) as raised:
        probe.probe_file(str(image), 10_000)
    assert raised.value.errno == getattr(errno, code)

    def forbidden(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(probe, "open_regular", forbidden)
    with pytest.raises(InputError):  # a fact about the file: quarantined
        probe.probe_file(str(image), 10_000)
