"""The light Dataflow path: workers get recordforge from an sdist of this pyproject.toml.

`--setup_file=pyproject.toml` makes Beam build that sdist itself (no setup.py needed since Beam
accepts pyproject.toml there); these tests run Beam's own build step on a clean copy of the
repository and check what would reach the workers.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest
from apache_beam.runners.portability.stager import Stager
from deploy_files import ROOT, pyproject

PROJECT = pyproject()
PACKAGES = PROJECT["tool"]["setuptools"]["packages"]
PACKAGE_DIRS = PROJECT["tool"]["setuptools"]["package-dir"]


def source_folder(package: str) -> str:
    """Where a package's modules sit in the repository (pyproject's package-dir mapping)."""
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        mapped = PACKAGE_DIRS.get(".".join(parts[:cut]))
        if mapped is not None:
            return "/".join([mapped, *parts[cut:]])
    return "/".join(parts)


@pytest.fixture(scope="module")
def clean_copy(tmp_path_factory) -> pathlib.Path:
    """The files a clone of the repository has (tracked or new, not ignored), nothing else."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    copy = tmp_path_factory.mktemp("repository")
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    return copy


@pytest.fixture(scope="module")
def sdist(clean_copy, tmp_path_factory) -> pathlib.Path:
    """The tarball Beam stages for --setup_file=pyproject.toml, built by Beam's own code."""
    out = tmp_path_factory.mktemp("staging")
    return pathlib.Path(Stager._build_setup_package(str(clean_copy / "pyproject.toml"), str(out)))


def test_beam_builds_the_sdist_from_pyproject_alone(clean_copy, sdist):
    assert not (clean_copy / "setup.py").exists()
    version = PROJECT["project"]["version"]
    assert sdist.name == f"recordforge-{version}.tar.gz"
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for package in PACKAGES:
        assert f"{source_folder(package)}/__init__.py" in names, package
    assert {"pyproject.toml", "README.md", "schemas/recordforge_example.proto"} <= names
    assert "schemas/recordforge_example_pb2.py" in names
    assert "pipelines/flex_template.py" in names
    # Everything a worker imports is in it: every module of every package in the repository.
    for package in PACKAGES:
        for module in (ROOT / source_folder(package)).glob("*.py"):
            assert str(module.relative_to(ROOT)) in names, module


def test_the_sdist_installs_only_recordforges_packages(sdist, tmp_path):
    """What pip makes of the staged sdist on a worker: one top-level package and the CLI."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(tmp_path), str(sdist)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("recordforge-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == {"recordforge"}  # no pipelines/, tests/, deploy/, benchmarks/ beside it
    assert "recordforge = recordforge.command:main" in scripts
    assert "recordforge/schemas/recordforge_example.proto" in names
    for package in PACKAGES:
        assert f"{package.replace('.', '/')}/__init__.py" in names, package
