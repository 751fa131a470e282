"""One Beam version everywhere: pyproject.toml, the Dockerfile, the Flink/Spark images, the docs."""

from __future__ import annotations

import shutil
from collections import Counter

import apache_beam
from deploy_files import DEPLOY, ROOT, beam_pin, beam_pins, dockerfile_stages


def disagreements(pins: list[tuple[str, int, str]], version: str) -> list[str]:
    return [f"{file}:{line}: {found}" for file, line, found in pins if found != version]


def test_every_beam_version_named_is_the_pyproject_pin():
    version = beam_pin()
    pins = beam_pins(ROOT)
    assert not disagreements(pins, version), (
        f"Beam is pinned to {version} in pyproject.toml, but these name another version: "
        f"{disagreements(pins, version)}"
    )
    # The pin really is found in each kind of place (a pattern that matches nothing checks nothing).
    files = Counter(file for file, _, _ in pins)
    for expected in (
        "pyproject.toml",
        "deploy/Dockerfile",
        "deploy/flink/beam-job-server.yaml",
        "deploy/README.md",
        "README.md",
    ):
        assert files[expected] >= 1, f"no Beam version found in {expected}"


def test_the_installed_beam_is_the_pin():
    assert apache_beam.__version__ == beam_pin()


def test_the_dockerfile_builds_from_the_pinned_sdk_image():
    (_, worker) = dockerfile_stages((DEPLOY / "Dockerfile").read_text())
    assert worker.image.startswith("apache/beam_python")
    assert worker.image.endswith(f"_sdk:{beam_pin()}")


def test_a_drifted_pin_is_caught(tmp_path):
    """A copy of the repository's pinned files with one Dockerfile pin changed fails the check."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    version = beam_pin()
    assert not disagreements(beam_pins(tmp_path), version)

    dockerfile = tmp_path / "deploy" / "Dockerfile"
    text = dockerfile.read_text()
    assert f"BEAM_VERSION={version}" in text
    dockerfile.write_text(text.replace(f"BEAM_VERSION={version}", "BEAM_VERSION=2.76.0"))
    assert disagreements(beam_pins(tmp_path), version) == [
        f"deploy/Dockerfile:{_line_of(text, f'BEAM_VERSION={version}')}: 2.76.0"
    ]

    job_server = tmp_path / "deploy" / "flink" / "beam-job-server.yaml"
    text = job_server.read_text()
    job_server.write_text(text.replace(f"_job_server:{version}", "_job_server:2.78.0"))
    drifted = disagreements(beam_pins(tmp_path), version)
    assert any("beam-job-server.yaml" in d and d.endswith("2.78.0") for d in drifted)


def _line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)
