"""Command-line options of `convert` and `plan`, and their translation into a ConvertConfig."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import uuid
from collections.abc import Collection, Mapping, Sequence

from recordforge.pipelines import preflight
from recordforge.pipelines.source_splits import check_class_names, resolve_source_splits
from recordforge.pipelines.tables import StagedTable
from recordforge.transforms.convert import ConvertConfig
from recordforge.transforms.core.errors import UsageError
from recordforge.transforms.core.files.naming import COMPRESSIONS
from recordforge.transforms.core.images.preprocess import (
    DEFAULT_QUALITY,
    ENCODINGS,
    RESIZE_MODES,
    Preprocessing,
)
from recordforge.transforms.core.images.probe import DEFAULT_MAX_PIXELS
from recordforge.transforms.core.planning.labels import LABEL_MODES, STRAY_FILE_MODES
from recordforge.transforms.core.planning.sharding import MIB, ShardingConfig
from recordforge.transforms.core.records import CsvRoles, Source
from recordforge.transforms.internals import parser_actions


def add_input_options(parser: argparse.ArgumentParser) -> None:
    """Options that say what the inputs are and how records are planned (convert and plan)."""
    parser.add_argument(
        "sources",
        nargs="+",
        metavar="SOURCE",
        help="image folders, image files, CSV files, or globs of them (local paths or gs://...); "
        "SOURCE=SPLIT puts all of a source in that split. A folder whose first-level folders "
        "are all split names (train, validation, val, valid, dev, eval, test) holds its splits "
        "(root/<split>/<class>/<file>), and sources named so (data/train data/test, "
        "train.csv test.csv) are their splits",
    )
    inputs = parser.add_argument_group("inputs")
    inputs.add_argument(
        "--labels",
        type=_label_mode,
        choices=LABEL_MODES,
        default="auto",
        help="image folders: class labels from class folders, root/<class>/<file> (below split "
        "folders: root/<split>/<class>/<file>). 'auto' (default): when most images of every "
        "folder source sit one folder deep; 'folder': the first folder level, always; 'none': "
        "no labels",
    )
    inputs.add_argument("--image-column", help="CSV: column naming an image file per row")
    inputs.add_argument("--label-column", help="CSV: column holding the class label")
    inputs.add_argument("--schema", help="CSV: YAML or JSON file describing the columns")
    inputs.add_argument(
        "--delimiter", help="CSV: field delimiter (default: the schema file's, else ',')"
    )
    inputs.add_argument(
        "--null-values",
        type=_null_values,
        metavar="LIST",
        help="CSV: comma-separated cell texts that mean a missing value, besides the empty cell "
        "(default: pandas' read_csv defaults: NA, N/A, NaN, nan, null, NULL, None, <NA>, #N/A, "
        "...; '' for the empty cell only). A missing cell's feature is left out of its Example",
    )
    inputs.add_argument(
        "--drop-index",
        action="store_true",
        help="CSV: drop an unnamed first column, the index pandas' df.to_csv() writes unless "
        "given index=False",
    )
    inputs.add_argument(
        "--stray-files",
        choices=STRAY_FILE_MODES,
        default="error",
        help="image folders with class labels: an image outside the class folders (root/<file>) "
        "is an error record ('error', the default), or converted without a label ('unlabeled')",
    )
    inputs.add_argument(
        "--check-pixels",
        action="store_true",
        help="decode every image in full when it is written (slower): an image that does not "
        "decode is an error record. Without it images are checked by their structure (PNG "
        "CRCs and data stream, JPEG markers, GIF, WebP and BMP layout)",
    )
    inputs.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="follow symbolic links to folders, also those leading out of a source (loops are "
        "detected); by default they are not followed, and counted in the manifest",
    )
    inputs.add_argument(
        "--allowed-root",
        action="append",
        metavar="DIR",
        help="open only files under DIR (repeatable; local or gs://): an image a CSV row names, "
        "or a symbolic link leads to, outside every allowed root is an OutsideAllowedRoot "
        "error record and is not read (default: no limit)",
    )
    inputs.add_argument(
        "--max-image-pixels",
        type=int,
        default=DEFAULT_MAX_PIXELS,
        help="reject images with more pixels as decompression bombs (default: Pillow's "
        f"limit, {DEFAULT_MAX_PIXELS:,})",
    )
    add_preprocessing_options(parser)
    add_split_options(parser, column=True)
    add_sharding_options(parser)
    add_error_rate_option(parser)


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser, whose mistakes are UsageErrors (one line on stderr, the usage is in
    --help), as every other usage error is, and never an exit from a library call;
    subcommands get the same class."""

    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)" if self.add_help else message)


def set_keyword_options(
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    options: Mapping,
    *,
    caller: str,
    not_options: Collection[str],
) -> argparse.Namespace:
    """`parser`'s reading of `argv` with keyword arguments as options over it, for a Python
    call (`reshard()`, `WriteDataset`): each value goes through the option's own parsing, as
    on the command line (a switch takes True or False only; a number its type's text).

    Raises:
        UsageError: a keyword that is none of the options' names, or one of `not_options`;
            a value the option does not take.
    """
    actions = {a.dest: a for a in parser_actions(parser) if a.option_strings}
    flags: list[str] = []
    for key, value in options.items():
        if key in not_options or key not in actions:
            known = ", ".join(sorted(k for k in actions if k not in not_options))
            raise UsageError(f"{caller} has no option {key!r} (its options: {known})")
        flags += keyword_flags(actions[key], key, value)
    return checked_lists(parser.parse_args([*argv, *flags]), options)


def keyword_flags(action: argparse.Action, key: str, value) -> list[str]:
    """The command-line flags that give option `action` the keyword argument's `value`."""
    option = max(action.option_strings, key=len)
    if value is None:
        return []
    if action.nargs == 0:  # a switch: --overwrite
        if not isinstance(value, bool):
            raise UsageError(f"{key} is True or False, got {value!r}")
        return [option] if value else []
    if isinstance(value, bool):
        raise UsageError(f"{key} takes a value, not {value!r}")
    if key == "splits" and isinstance(value, Mapping):
        value = ",".join(f"{name}={fraction!r}" for name, fraction in value.items())
    if _is_sequence(value):
        return [f"{option}={_text(item)}" for item in value]
    return [f"{option}={_text(value)}"]


def checked_lists(args: argparse.Namespace, options: Mapping) -> argparse.Namespace:
    """`args`, unless a keyword was given a list for an option that takes one value."""
    for key, value in options.items():
        if _is_sequence(value) and not isinstance(getattr(args, key), list):
            raise UsageError(f"{key} takes one value, not a list")
    return args


def _is_sequence(value) -> bool:
    return isinstance(value, list | tuple)


def _text(value) -> str:
    if isinstance(value, str | bytes | os.PathLike):
        return os.fsdecode(value)
    return str(value)


def add_preprocessing_options(parser: argparse.ArgumentParser) -> None:
    """--resize, --resize-mode, --encode, --quality, --channels: opt-in pixel work."""
    images = parser.add_argument_group(
        "image preprocessing (opt-in; without these options image files are stored as they are)"
    )
    images.add_argument(
        "--resize",
        metavar="WxH|N",
        help="WxH: exactly W by H pixels, center-cropped to that aspect first (see "
        "--resize-mode); N: the shorter side N pixels, the aspect kept. EXIF orientation is "
        "applied first",
    )
    images.add_argument(
        "--resize-mode",
        choices=RESIZE_MODES,
        help="with --resize WxH: 'crop' (the default) center-crops to the aspect, 'pad' fits "
        "the whole image and pads it with black",
    )
    images.add_argument(
        "--encode",
        choices=ENCODINGS,
        help="store images in this format (default with --resize/--channels: the source's "
        "format for JPEG, PNG and WebP, PNG for GIF and BMP)",
    )
    images.add_argument(
        "--quality",
        help=f"JPEG/WebP quality, 1-100 (default: {DEFAULT_QUALITY['jpeg']} for JPEG, "
        f"{DEFAULT_QUALITY['webp']} for WebP)",
    )
    images.add_argument(
        "--channels",
        choices=("1", "3"),
        help="store grey (1) or RGB (3) images (default: as the source, alpha kept where "
        "the format holds it)",
    )


def preprocessing_config(args: argparse.Namespace) -> Preprocessing:
    """The --resize/--encode/--quality/--channels options, checked.

    Raises:
        UsageError: a malformed or contradictory value.
    """
    size = shorter_side = None
    resize = getattr(args, "resize", None)
    if resize is not None:
        text = str(resize).strip().lower()
        width, x, height = text.partition("x")
        if x and width.isdigit() and height.isdigit() and int(width) > 0 and int(height) > 0:
            size = (int(width), int(height))
        elif not x and text.isdigit() and int(text) > 0:
            shorter_side = int(text)
        else:
            raise UsageError(
                f"--resize takes WxH (e.g. 224x224) or N (the shorter side), got {resize!r}"
            )
        longest = size or (shorter_side, shorter_side)
        if longest[0] * longest[1] > args.max_image_pixels:
            raise UsageError(
                f"--resize {resize} makes images larger than --max-image-pixels "
                f"({args.max_image_pixels:,} pixels)"
            )
    mode = getattr(args, "resize_mode", None)
    if mode is not None and size is None:
        raise UsageError("--resize-mode applies to --resize WxH (an exact size)")
    quality = getattr(args, "quality", None)
    encode = getattr(args, "encode", None)
    channels = getattr(args, "channels", None)
    if quality is not None:
        if not str(quality).strip().isdigit() or not 1 <= int(quality) <= 100:
            raise UsageError(f"--quality must be a whole number from 1 to 100, got {quality!r}")
        quality = int(quality)
        if encode == "png":
            raise UsageError("--quality applies to JPEG and WebP; PNG is lossless")
        if encode is None and size is None and shorter_side is None and channels is None:
            raise UsageError("--quality needs --encode jpeg|webp (or --resize)")
    if encode == "webp" and channels is not None and int(channels) == 1:
        raise UsageError("--channels 1 cannot be stored as WebP (it holds colour only)")
    return Preprocessing(
        size=size,
        shorter_side=shorter_side,
        mode=mode or "crop",
        encode=encode,
        quality=quality,
        channels=None if channels is None else int(channels),
    )


def add_split_options(
    parser: argparse.ArgumentParser, *, column: bool, default: str = "train=1"
) -> None:
    """--splits and --split-salt, and --split-column for CSV inputs (`column`)."""
    splits = parser.add_argument_group("splits")
    splits.add_argument(
        "--splits",
        help="fractions per split by a salted hash of each input's key, e.g. "
        f"train=0.8,validation=0.1,test=0.1 (default: {default})",
    )
    if column:
        splits.add_argument("--split-column", help="CSV: column naming each row's split")
    splits.add_argument(
        "--split-salt",
        default="recordforge",
        help="salt of the split and order hashes; change it to draw other splits",
    )


def add_sharding_options(parser: argparse.ArgumentParser) -> None:
    """The planner's thresholds."""
    sharding = parser.add_argument_group("sharding")
    sharding.add_argument(
        "--num-hosts",
        type=int,
        default=1,
        help="how many hosts will READ the dataset in training (aim: ~10 files per host)",
    )
    sharding.add_argument(
        "--min-shard-mb", type=float, default=10, help="smallest shard, in MiB (default: 10)"
    )
    sharding.add_argument(
        "--max-shard-mb", type=float, default=200, help="largest shard, in MiB (default: 200)"
    )
    sharding.add_argument("--num-shards", type=int, help="force this many shards per split")


def add_error_rate_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-error-rate",
        type=float,
        help="fail (exit 1, no dataset_info.json) when more than this fraction of inputs fail",
    )


# Bounds of numeric options: far beyond any real dataset, small enough that no count, byte size
# or array derived from them overflows or exhausts memory before the run starts.
MAX_COUNT = 1_000_000
MAX_SHARD_MB = 1 << 20  # 1 TiB
MAX_IMAGE_PIXELS_LIMIT = 1 << 40
# Options whose values may be file names, which need not be UTF-8 (see core.files.filenames).
_PATH_OPTIONS = frozenset({"sources", "allowed_root"})


def checked_delimiter(value: str) -> str:
    """A --delimiter value: one ASCII character other than a quote or a line end ("\\t" is a
    tab).

    Raises:
        UsageError: anything else.
    """
    if value in ("\\t", "tab"):
        return "\t"
    if len(value) != 1 or not value.isascii() or value in '"\r\n':
        raise UsageError(
            f"--delimiter must be one ASCII character other than a quote or a line end "
            f"(or '\\t' for a tab), got {value!r}"
        )
    return value


def _check_text_options(args: argparse.Namespace) -> None:
    """Option values that are not UTF-8 text (arguments are bytes on POSIX) are refused here,
    before they reach a hash, a header comparison or a JSON manifest: file names excepted."""
    for name, value in sorted(vars(args).items()):
        values = value if isinstance(value, list) else [value]
        for item in values:
            if name in _PATH_OPTIONS or not isinstance(item, str):
                continue
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                shown = item.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
                option = "--" + name.replace("_", "-")
                raise UsageError(f"{option} {shown!r} is not valid UTF-8 text") from None


def _null_values(value: str) -> tuple[str, ...]:
    """--null-values: `NA,null` → ("", "NA", "null"); the empty cell is always missing."""
    texts = [text.strip() for text in value.split(",")]
    return ("", *dict.fromkeys(text for text in texts if text))


def _label_mode(value: str) -> str:
    # Beam's Dataflow option --labels (job labels) shares the name; recordforge's hides it, so
    # Beam's must be passed by its other spelling, --label, which argparse then leaves to Beam.
    if value not in LABEL_MODES and ("=" in value or value.lstrip().startswith("{")):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a label mode ({', '.join(LABEL_MODES)}): recordforge's --labels "
            "says how images get class labels; for Dataflow job labels give Beam's --label "
            "KEY=VALUE (singular), once per label"
        )
    return value


def add_output_options(parser: argparse.ArgumentParser, *, resumable: bool = True) -> None:
    """Options only `convert` has."""
    parser.add_argument("-o", "--output", required=True, help="dataset folder (local or gs://)")
    parser.add_argument("--name", help="shard file name prefix (default: the output folder's name)")
    parser.add_argument(
        "--compression",
        choices=COMPRESSIONS,
        default="none",
        help="compress the shards (default: none)",
    )
    parser.add_argument(
        "--write-index",
        action="store_true",
        help="write each shard's record index to index/{shard}.idx (one 'offset length' line "
        "per record), as NVIDIA DALI's TFRecord reader and the tfrecord package read it",
    )
    parser.add_argument(
        "--tfds",
        action="store_true",
        help="also write TensorFlow Datasets' metadata, so tfds.builder_from_directory(OUTPUT) "
        "loads the dataset; dataset_info.json is then TFDS's and recordforge's manifest is "
        "recordforge.json",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the dataset in the output folder (it stays as it was until the new one "
        "is complete)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help=(
            "continue a run that was killed, stopped or failed: keep the shards it staged "
            "and write the rest (same inputs and options; refused, saying what changed, otherwise)"
            if resumable
            else "refused: a reshard cannot be continued; a rerun starts over (and finishes an "
            "interrupted commit first)"
        ),
    )


def tool_version() -> str:
    try:
        return importlib.metadata.version("recordforge")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def build_config(
    args: argparse.Namespace, *, output: str | None, tables: Sequence[StagedTable] = ()
) -> ConvertConfig:
    """Validate the options and inputs and resolve them into a ConvertConfig (no writes).

    `tables` are the tables of the Python API among the sources, staged as CSV files.
    """
    _check_text_options(args)
    sharding = sharding_config(args)
    check_error_rate(args.max_error_rate)
    if not 1 <= args.max_image_pixels <= MAX_IMAGE_PIXELS_LIMIT:
        raise UsageError(
            f"--max-image-pixels must be between 1 and {MAX_IMAGE_PIXELS_LIMIT:,}, "
            f"got {args.max_image_pixels:,}"
        )
    if args.delimiter is not None:
        args.delimiter = checked_delimiter(args.delimiter)
    preprocessing = preprocessing_config(args)
    if args.split_column and args.splits:
        raise UsageError("--splits and --split-column exclude each other")
    splits = preflight.parse_splits(args.splits) if args.splits else (("train", 1.0),)
    roles = CsvRoles(args.image_column, args.label_column, args.split_column)
    sources = preflight.resolve_sources(args.sources, follow_symlinks=args.follow_symlinks)
    sources = _named_tables(sources, tables)
    named = resolve_source_splits(
        sources,
        ratio_splits=bool(args.splits),
        split_column=bool(args.split_column),
        follow_symlinks=args.follow_symlinks,
    )
    sources = named.sources
    if named.splits:  # every input names its split: no hash chooses one
        splits = tuple((name, 1 / len(named.splits)) for name in named.splits)
    kind = sources[0].kind
    csv_schema = None
    if kind == "csv":
        if args.labels != "auto":
            raise UsageError("--labels applies to image folders; for CSV use --label-column")
        csv_schema = preflight.resolve_csv_schema(
            sources,
            schema_path=args.schema,
            roles=roles,
            delimiter=args.delimiter,
            null_values=args.null_values,
            drop_index=args.drop_index,
        )
    else:
        if args.labels != "none":
            check_class_names(sources, follow_symlinks=args.follow_symlinks)
        for option, value in (
            ("--image-column", args.image_column),
            ("--label-column", args.label_column),
            ("--split-column", args.split_column),
            ("--schema", args.schema),
            ("--null-values", args.null_values),
            ("--drop-index", args.drop_index),
            ("--delimiter", args.delimiter),
        ):
            if value:
                raise UsageError(
                    f"{option} applies to CSV inputs (files named .csv or .csv.gz), and the "
                    "inputs are images"
                )
    if preprocessing.active and kind == "csv" and not args.image_column:
        raise UsageError(
            "--resize, --encode, --quality and --channels apply to images, and the CSV names "
            "none (--image-column)"
        )
    name, compression, write_index, tfds = output_settings(args, output)
    if output is not None:
        # With --split-column the split names are in the data: a row's that is too long fails
        # the run where its shard is written (transforms.write); the name alone is checked here.
        preflight.check_file_name_lengths(
            output,
            name,
            ("x",) if args.split_column else [split for split, _ in splits],
            compression,
            write_index,
            given_name=getattr(args, "name", None) is not None,
        )
    # A staged table is not a file of the user's; the images its rows name are confined.
    allowed_roots = preflight.resolve_allowed_roots(
        args.allowed_root or (), [s for s in sources if not s.references]
    )
    # Recorded only when not the default, so that a manifest made without them is unchanged.
    chosen = {
        "check_pixels": args.check_pixels,
        "follow_symlinks": args.follow_symlinks,
        "allowed_roots": list(allowed_roots),
        "stray_files": args.stray_files if args.stray_files != "error" else None,
        "null_values": list(args.null_values) if args.null_values is not None else None,
        "drop_index": args.drop_index,
    }
    return ConvertConfig(
        sources=sources,
        output=output,
        name=name or "plan",
        splits=splits,
        split_note=named.note,
        salt=args.split_salt,
        label_mode=args.labels,
        roles=roles,
        csv_schema=csv_schema,
        sharding=sharding,
        compression=compression,
        write_index=write_index,
        tfds=tfds,
        max_error_rate=args.max_error_rate,
        max_image_pixels=args.max_image_pixels,
        check_pixels=args.check_pixels,
        preprocessing=preprocessing,
        follow_symlinks=args.follow_symlinks,
        allowed_roots=allowed_roots,
        stray_files=args.stray_files,
        run_id=uuid.uuid4().hex[:12],
        tool_version=tool_version(),
        shown_as={table.path: table.label for table in tables},
        options={
            "name": name,
            "splits": None if args.split_column or named.splits else dict(splits),
            "split_column": args.split_column,
            "split_salt": args.split_salt,
            "labels": args.labels if kind == "images" else None,
            "image_column": args.image_column,
            "label_column": args.label_column,
            "max_image_pixels": args.max_image_pixels,
            "compression": compression,
            "write_index": write_index,
            "tfds": tfds,
            "sharding": sharding.to_dict(),
            **({"source_splits": named.by_source} if named.splits else {}),
            # Only when asked for: a manifest made without it is unchanged.
            **({"preprocessing": preprocessing.to_dict()} if preprocessing.active else {}),
            **{key: value for key, value in chosen.items() if value},
        },
    )


def _named_tables(sources: Sequence[Source], tables: Sequence[StagedTable]) -> tuple[Source, ...]:
    """The sources, a staged table's named as its label and reading paths from its folder."""
    by_path = {table.path: table for table in tables}
    return tuple(
        source._replace(
            given=by_path[source.pattern].label, references=by_path[source.pattern].references
        )
        if source.pattern in by_path
        else source
        for source in sources
    )


def check_error_rate(rate: float | None) -> None:
    if rate is not None and not 0 <= rate <= 1:
        raise UsageError(f"--max-error-rate must be between 0 and 1, got {rate:g}")


def output_settings(
    args: argparse.Namespace, output: str | None
) -> tuple[str | None, str, bool, bool]:
    """(name, compression, write_index, tfds) of the output options, checked together."""
    name = getattr(args, "name", None)
    if output is not None:
        name = name or preflight.default_name(output)
        preflight.check_name(name)
    compression = getattr(args, "compression", "none")
    write_index = getattr(args, "write_index", False)
    tfds = getattr(args, "tfds", False)
    if compression not in COMPRESSIONS:
        raise UsageError(f"--compression must be one of {', '.join(COMPRESSIONS)}")
    if compression != "none" and write_index:
        raise UsageError(
            "--write-index needs uncompressed shards: an index locates records by byte offset, "
            "which --compression gzip hides"
        )
    if compression != "none" and tfds:
        raise UsageError("--tfds needs uncompressed shards: TensorFlow Datasets reads no gzip")
    return name, compression, write_index, tfds


def sharding_config(args: argparse.Namespace) -> ShardingConfig:
    """The planner's thresholds from --num-hosts, --min/max-shard-mb and --num-shards."""
    if not 1 <= args.num_hosts <= MAX_COUNT:
        raise UsageError(f"--num-hosts must be between 1 and {MAX_COUNT:,}, got {args.num_hosts}")
    for option, value in (
        ("--min-shard-mb", args.min_shard_mb),
        ("--max-shard-mb", args.max_shard_mb),
    ):
        # nan fails both comparisons; inf (or 1e400) would overflow the byte count.
        if not 0 < value <= MAX_SHARD_MB:
            raise UsageError(
                f"{option} must be a number of MiB above 0 and at most {MAX_SHARD_MB:,}, "
                f"got {value:g}"
            )
    if args.min_shard_mb > args.max_shard_mb:
        raise UsageError(
            f"--min-shard-mb ({args.min_shard_mb:g}) is larger than --max-shard-mb "
            f"({args.max_shard_mb:g})"
        )
    if args.num_shards is not None and not 1 <= args.num_shards <= MAX_COUNT:
        raise UsageError(f"--num-shards must be between 1 and {MAX_COUNT:,}, got {args.num_shards}")
    min_bytes, max_bytes = int(args.min_shard_mb * MIB), int(args.max_shard_mb * MIB)
    return ShardingConfig(
        num_hosts=args.num_hosts,
        min_shard_bytes=min_bytes,
        ideal_shard_bytes=min(max(100 * MIB, min_bytes), max_bytes),
        max_shard_bytes=max_bytes,
        num_shards=args.num_shards,
    )
