"""Readers for the deployment files (Dockerfile, YAML, pins), for the offline deploy/ tests."""

from __future__ import annotations

import pathlib
import re
import shlex
import sys
from dataclasses import dataclass

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as the `tomli` package (a dependency of `build`)
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"


def pyproject(root: pathlib.Path = ROOT) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text())


def beam_pin(root: pathlib.Path = ROOT) -> str:
    """The Beam version pyproject.toml pins (apache-beam[gcp]==X)."""
    (beam,) = [d for d in pyproject(root)["project"]["dependencies"] if d.startswith("apache-beam")]
    return beam.split("==")[1]


@dataclass(frozen=True)
class Instruction:
    keyword: str  # FROM, ARG, COPY, RUN, ...
    arguments: str  # the rest of the (joined) line, variables not substituted


def dockerfile_instructions(text: str) -> list[Instruction]:
    """A Dockerfile's instructions, with continuation lines joined and comments dropped."""
    instructions, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = pending + stripped
        pending = ""
        keyword, _, arguments = whole.partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def substitute(text: str, variables: dict[str, str]) -> str:
    """Replace ${NAME} and $NAME as Docker does; an unknown variable is an error here."""

    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise KeyError(f"${name} is not declared by an ARG or ENV before its use")
        return variables[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, text)


@dataclass(frozen=True)
class Stage:
    image: str  # the FROM image, variables substituted
    alias: str | None
    instructions: list[Instruction]
    variables: dict[str, str]  # ARG/ENV values visible in the stage


def dockerfile_stages(text: str, build_args: dict[str, str] | None = None) -> list[Stage]:
    """Resolve a Dockerfile's stages as `docker build` would (ARG scoping included)."""
    instructions = dockerfile_instructions(text)
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for instruction in instructions:
        if instruction.keyword == "ARG":
            name, _, default = instruction.arguments.partition("=")
            target = stages[-1].variables if stages else global_args
            if build_args and name in build_args:
                target[name] = build_args[name]
            elif default:
                target[name] = substitute(default, {**global_args, **target})
            elif stages and name in global_args:
                # `ARG NAME` inside a stage re-imports the global value (Docker's scoping).
                target[name] = global_args[name]
            elif not default:
                target[name] = ""
        elif instruction.keyword == "FROM":
            parts = instruction.arguments.split()
            alias = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(substitute(parts[0], global_args), alias, [], {}))
        else:
            assert stages, f"{instruction.keyword} before the first FROM"
            stages[-1].instructions.append(instruction)
            if instruction.keyword == "ENV":
                name, _, value = instruction.arguments.partition("=")
                stages[-1].variables[name] = substitute(value, stages[-1].variables)
    return stages


def copy_sources(instruction: Instruction) -> tuple[list[str], str, str | None]:
    """A COPY's sources, destination and --from stage."""
    words = shlex.split(instruction.arguments)
    source_stage = None
    while words and words[0].startswith("--"):
        flag = words.pop(0)
        if flag.startswith("--from="):
            source_stage = flag.split("=", 1)[1]
    return words[:-1], words[-1], source_stage


# Every place that names a Beam version: the Python package, Beam's Docker images, Dockerfile ARGs.
PIN_PATTERNS = (
    re.compile(r"apache-beam(?:\[[\w,]+\])?==([0-9][\w.]*)"),
    re.compile(r"apache/beam_[a-z0-9_.]+:([0-9][\w.]*)"),
    re.compile(r"\bBEAM_VERSION=([0-9][\w.]*)"),
)
PINNED_FILES = ("pyproject.toml", "README.md", "deploy")


def beam_pins(root: pathlib.Path) -> list[tuple[str, int, str]]:
    """Every Beam version named in pyproject.toml, README.md and deploy/: (file, line, version)."""
    found = []
    for name in PINNED_FILES:
        path = root / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
                for pattern in PIN_PATTERNS:
                    for match in pattern.finditer(line):
                        found.append((str(file.relative_to(root)), number, match.group(1)))
    return found
