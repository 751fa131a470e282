"""The layers hold in the installed package (docs/design.md, "Layers").

import-linter checks pyproject's contracts: the pure layers import no Beam, schemas imports
nothing from transforms or pipelines, transforms nothing from pipelines. The private APIs of
dependencies stay in recordforge.transforms.internals: no other module imports Beam's private
modules or grpc, or reaches for the private attributes gathered there (read from each module's
syntax tree; import-linter cannot name parts of an external package). Each check is also run
on a copy of the package with one forbidden import added, and must fail there.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import recordforge.transforms

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
INSTALLED = Path(recordforge.transforms.__file__).parents[1]  # site-packages/recordforge
INTERNALS = Path("transforms/internals.py")  # relative to INSTALLED

# Modules only recordforge.transforms.internals may import (it and every submodule).
PRIVATE_MODULES = (
    "apache_beam.internal",
    "apache_beam.runners.common",
    "apache_beam.runners.dask",
    "apache_beam.runners.portability.fn_api_runner",
    "apache_beam.runners.worker",
    "apache_beam.transforms.sideinputs",
    "apache_beam.transforms.userstate",
    "apache_beam.utils",
    "apache_beam.io.gcp.gcsio",
    "grpc",
)
# Private attributes of dependencies' objects that only internals may use.
PRIVATE_ATTRIBUTES = {
    "_actions",  # argparse.ArgumentParser
    "_blob",  # Beam's GCS reader
    "_gcsIO",  # Beam's GCSFileSystem
    "_view_options",  # Beam's side input views
    "_extract_bag_kwargs",  # Beam's DaskOptions
    "_add_argparse_args",  # Beam's PipelineOptions subclasses
    "_all_options",  # Beam's PipelineOptions
    "_metrics",  # Beam's PortableRunner result
}
# The text of runners' exceptions that only internals may match.
RUNNER_TEXTS = ("Worker subprocess exited", "Channel closed prematurely", "[while running")


def _lint_imports(package_parent: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run(
        [str(LINT_IMPORTS), str(PYPROJECT), "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _private_uses(package: Path) -> list[str]:
    """Where modules other than internals use a private API of a dependency."""
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if relative == INTERNALS or relative.name.endswith("_pb2.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{relative}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
                if not node.module.startswith("recordforge"):
                    names += [
                        f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")
                    ]
            else:
                names = []
            for name in names:
                if any(name == m or name.startswith(m + ".") for m in PRIVATE_MODULES):
                    found.append(f"{where}: imports {name}")
                elif name.rpartition(".")[2].startswith("_") and not name.startswith(
                    ("recordforge", "__future__")
                ):
                    found.append(f"{where}: imports private {name}")
            own = isinstance(node, ast.Attribute) and _is_self(node.value)
            if (
                isinstance(node, ast.Attribute)
                and not own
                and (
                    node.attr in PRIVATE_ATTRIBUTES
                    or (
                        isinstance(node.value, ast.Name)
                        and node.value.id == "argparse"
                        and node.attr.startswith("_")
                    )
                )
            ):
                found.append(f"{where}: uses .{node.attr}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for text in RUNNER_TEXTS:
                    if text in node.value:
                        found.append(f"{where}: matches runner text {text!r}")
    return found


def _is_self(node: ast.expr) -> bool:
    """`self` or an attribute of it: recordforge's own objects (a lock's own `_blob`)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "self"


def _copy_of_the_package(tmp_path: Path) -> Path:
    # Run as `python -m pytest` from the checkout, `recordforge` would be the repository's own
    # folder, and this would copy the whole checkout (virtualenv included) for each case.
    assert "site-packages" in INSTALLED.parts, f"not the installed package: {INSTALLED}"
    copy = tmp_path / "site" / "recordforge"
    shutil.copytree(INSTALLED, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_the_installed_package_keeps_the_import_contracts(tmp_path):
    result = _lint_imports(INSTALLED.parent, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "forbidden_import", "contract"),
    [
        ("transforms/core/planning/keys.py", "import apache_beam", "import no Beam"),
        ("pipelines/inspection/checks.py", "import apache_beam", "import no Beam"),
        (
            "schemas/codec.py",
            "from recordforge.transforms.core.planning import keys",
            "schemas imports",
        ),
        ("transforms/write.py", "import recordforge.pipelines.cli", "transforms (and"),
    ],
)
def test_a_forbidden_import_breaks_a_contract(tmp_path, module, forbidden_import, contract):
    copy = _copy_of_the_package(tmp_path)
    with open(copy / module, "a") as f:
        f.write(f"\n{forbidden_import}  # noqa\n")
    result = _lint_imports(copy.parent, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    broken = [line for line in result.stdout.splitlines() if line.endswith("BROKEN")]
    assert len(broken) == 1 and contract in broken[0], result.stdout


def test_only_internals_uses_private_apis_of_dependencies():
    assert _private_uses(INSTALLED) == []
    # internals itself is where they are: the check would see them there.
    assert INSTALLED.joinpath(INTERNALS).is_file()


@pytest.mark.parametrize(
    "private_use",
    [
        "from apache_beam.utils.windowed_value import WindowedValue",
        "import grpc",
        "from apache_beam.runners.dask.overrides import _Reshuffle",
        "from apache_beam.io.filesystem import _private_thing",
        "actions = parser._actions",
        "kind = argparse._StoreTrueAction",
        "blob = reader._blob",
        "LOST = 'Worker subprocess exited with return code'",
    ],
)
def test_a_private_use_outside_internals_is_found(tmp_path, private_use):
    copy = _copy_of_the_package(tmp_path)
    with open(copy / "pipelines" / "runner.py", "a") as f:
        f.write(f"\n\ndef _probe(parser, reader):\n    {private_use}\n")
    findings = _private_uses(copy)
    assert findings and all(f.startswith("pipelines/runner.py:") for f in findings), findings
