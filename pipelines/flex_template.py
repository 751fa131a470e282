"""Dataflow Flex Template entry point: template parameters in, a submitted `convert` out.

Dataflow starts the template's Python file with every parameter as `--name=value` (names as in
deploy/dataflow/metadata.json: the `convert` options' names with underscores), followed by its
own pipeline options (`--project`, `--region`, `--temp_location`, ...). This module turns the
former into `recordforge convert` arguments and passes the latter on to Beam untouched.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from recordforge.pipelines import cli, preflight
from recordforge.transforms.core.errors import UsageError
from recordforge.transforms.core.files.paths import glob_root, has_glob, parent_folder
from recordforge.transforms.internals import action_kind, parser_actions

# `sources` is one parameter holding every SOURCE argument, separated by this.
LIST_SEPARATOR = ","
# Options whose name is also a Beam pipeline option: `--labels` is Dataflow's job labels too, and
# the launch passes Beam's options in the same argument list, so the parameter takes another name.
RENAMED = {"labels": "label_mode"}
# Options that choose where the pipeline runs (recordforge's runner shorthands, when the CLI has
# them, and --workers for the local runner): a template always runs on Dataflow, so they are
# not template parameters.
RUNNER_OPTIONS = frozenset({"runner", "worker_pool", "workers"})
_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0", "")


@dataclass(frozen=True)
class TemplateParameter:
    """One `convert` option as a template parameter.

    Attributes:
        name: the parameter's name: the option's argparse dest (`num_hosts`), or its name in
            RENAMED.
        flag: the long option it becomes (`--num-hosts`), or None for the SOURCE arguments.
        kind: `list` (the SOURCE arguments), `repeated` (an option given once per value, as
            `--allowed-root`; the parameter separates them by LIST_SEPARATOR), `switch` (a flag
            without value), `count` (`-v`, given N times) or `value`.
        required: whether `convert` refuses to run without it.
        choices: the values the option accepts, when it has a fixed set.
        value_type: `int`, `float` or `str`.
        default: the option's default, or None.
        help: the option's help text.
    """

    name: str
    flag: str | None
    kind: str
    required: bool
    choices: tuple[str, ...] | None
    value_type: str
    default: object
    help: str


def template_parameters() -> list[TemplateParameter]:
    """Every option of `recordforge convert` but RUNNER_OPTIONS, read from its argument parser."""
    found = []
    for action in parser_actions(cli.command_parser("convert")):
        kind = action_kind(action)
        if kind == "help" or action.dest in RUNNER_OPTIONS:
            continue
        long_flags = [s for s in action.option_strings if s.startswith("--")]
        if not action.option_strings:
            kind = "list"
        value_type = "int" if kind == "count" else getattr(action.type, "__name__", "str")
        found.append(
            TemplateParameter(
                name=RENAMED.get(action.dest, action.dest),
                flag=long_flags[0] if long_flags else None,
                kind=kind,
                required=bool(action.required),
                choices=tuple(action.choices) if action.choices else None,
                value_type=value_type if value_type in ("int", "float") else "str",
                default=action.default,
                help=action.help or "",
            )
        )
    return found


def convert_arguments(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split a template launch's arguments into `recordforge convert …` and Beam's arguments.

    The two are kept apart rather than handed to the CLI as one list: Dataflow passes Beam's
    `--labels` (the job's labels), which the CLI would read as its own `--labels`.

    Raises:
        UsageError: a switch whose value is not true/false, a count that is not a number.
    """
    parameters = template_parameters()
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for parameter in parameters:
        parser.add_argument(f"--{parameter.name}", dest=parameter.name)
    given, beam_args = parser.parse_known_args(list(argv))
    sources, options = [], []
    for parameter in parameters:
        value = getattr(given, parameter.name)
        if value is None:
            continue
        if parameter.kind == "list":
            sources += [item.strip() for item in value.split(LIST_SEPARATOR) if item.strip()]
        elif parameter.kind == "repeated":
            items = [item.strip() for item in value.split(LIST_SEPARATOR) if item.strip()]
            options += [f"{parameter.flag}={item}" for item in items]
        elif parameter.kind == "switch":
            options += [parameter.flag] if _switch(parameter.name, value) else []
        elif parameter.kind == "count":
            options += [parameter.flag] * _count(parameter.name, value)
        else:
            options.append(f"{parameter.flag}={value}")
    if given.allowed_root is None:
        # A shared conversion service opens nothing outside what the job names: its inputs.
        options += [f"--allowed-root={root}" for root in _input_locations(sources)]
    return ["convert", *sources, *options], beam_args


def _input_locations(sources: Sequence[str]) -> list[str]:
    """The folders the inputs lie in: a glob's fixed part, a file's folder, a folder itself
    (a last segment with a dot is taken for a file: the confinement is then its folder)."""
    locations = []
    for argument in sources:
        source = preflight.split_source_argument(argument, False)[0].rstrip("/")  # SOURCE=SPLIT
        if has_glob(source):
            location = glob_root(source)
        elif "." in source.rsplit("/", 1)[-1]:
            location = parent_folder(source)
        else:
            location = source
        if location not in locations:
            locations.append(location)
    return locations


def _switch(name: str, value: str) -> bool:
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise UsageError(f"template parameter {name} must be true or false, got {value!r}")


def _count(name: str, value: str) -> int:
    if not value.strip().isdigit():
        raise UsageError(f"template parameter {name} must be a number (0, 1, 2), got {value!r}")
    return int(value)


def main(argv: Sequence[str] | None = None) -> int:
    """Submit the conversion the template parameters describe; returns the exit status."""
    try:
        arguments, beam_args = convert_arguments(sys.argv[1:] if argv is None else argv)
    except UsageError as error:
        print(f"recordforge: error: {error}", file=sys.stderr)
        return cli.EXIT_USAGE
    # Dataflow's documentation: a Flex Template's program must exit once run() has returned;
    # waiting for the job (wait_until_finish) blocks the launch.
    return cli.main(arguments, beam_argv=beam_args, submit_only=True)
