"""recordforge is one namespace: installed, it is `recordforge` and nothing else.

The repository's top-level folders (pipelines/, transforms/, schemas/) are its subpackages, so a
user's own modules with those generic names (a PyTorch project's transforms.py, a schemas/
folder) neither shadow recordforge's nor are shadowed by them.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

# A user's working folder: modules named like recordforge's folders that fail if imported.
DECOYS = {
    "transforms.py": "raise ImportError('the user transforms.py was imported')\n",
    "pipelines.py": "raise ImportError('the user pipelines.py was imported')\n",
    "schemas/__init__.py": "raise ImportError('the user schemas/ was imported')\n",
}


def test_the_installed_distribution_holds_one_top_level_package():
    files = importlib.metadata.files("recordforge")
    top_level = {file.parts[0] for file in files if file.parts[0] != ".."}  # ../bin: the script
    top_level = {part for part in top_level if not part.endswith(".dist-info")}
    assert top_level == {"recordforge"}
    names = {str(file) for file in files}
    for subpackage in ("pipelines", "transforms", "transforms/core", "schemas"):
        assert f"recordforge/{subpackage}/__init__.py" in names, subpackage
    (script,) = [
        e
        for e in importlib.metadata.entry_points(group="console_scripts")
        if e.name == "recordforge"
    ]
    assert script.value == "recordforge.command:main"


def test_import_recordforge_loads_neither_beam_nor_tensorflow(tmp_path):
    code = (
        "import sys, recordforge\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('apache_beam', 'tensorflow')]\n"
        "assert not heavy, heavy\n"
        "print(sorted(recordforge.__all__))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "'iterate'" in result.stdout and "'load'" in result.stdout


def test_a_working_folder_with_modules_named_like_recordforges_breaks_nothing(
    tmp_path, photo_folder
):
    work = tmp_path / "project"
    for name, text in DECOYS.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    out = tmp_path / "out"
    # `python -c` puts the working folder first on sys.path, as a notebook or script there does.
    code = (
        "import json, sys\n"
        "import recordforge\n"
        "from recordforge.pipelines.cli import main\n"
        f"status = main(['convert', {str(photo_folder)!r}, '--output', {str(out)!r}])\n"
        f"records = sum(1 for _ in recordforge.iterate({str(out)!r}, split='train'))\n"
        "print(json.dumps({'status': status, 'records': records}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=work, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reported = json.loads(result.stdout.strip().splitlines()[-1])
    manifest = json.loads((out / "dataset_info.json").read_text())
    assert reported == {"status": 0, "records": manifest["num_records"]}
    assert manifest["num_records"] == 10  # photo_folder's good images


def test_python_dash_m_recordforge_runs_from_such_a_folder(tmp_path, photo_folder):
    work = tmp_path / "project"
    for name, text in DECOYS.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "recordforge", "plan", str(photo_folder)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "train: 10 records" in result.stdout
