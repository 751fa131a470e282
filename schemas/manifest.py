"""The manifest (`dataset_info.json`): what a conversion wrote, and how and why."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from recordforge.schemas.features import FeatureSpec

FORMAT_VERSION = 1


def inside_the_dataset(name: str) -> str:
    """`name`, a file the manifest lists, if it names a file inside the dataset's folder.

    Readers join it to the folder: an absolute path, a URL or a `..` would lead them to files of
    another dataset, or anywhere, in a manifest that was edited or damaged.

    Raises:
        ValueError: it does not.
    """
    parts = name.split("/") if isinstance(name, str) else None
    if not parts or "://" in name or "\\" in name or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{name!r} is not the name of a file inside the dataset's folder")
    return name


@dataclass(frozen=True)
class ShardInfo:
    """One shard file: its name relative to the dataset folder, record count and exact size.

    `index` names its record index file (one "offset length" line per record), when written.
    """

    file: str
    num_records: int
    num_bytes: int
    index: str | None = None

    def __post_init__(self) -> None:
        inside_the_dataset(self.file)
        if self.index is not None:
            inside_the_dataset(self.index)

    def to_dict(self) -> dict:
        shard = {"file": self.file, "num_records": self.num_records, "num_bytes": self.num_bytes}
        if self.index is not None:
            shard["index"] = self.index
        return shard


@dataclass(frozen=True)
class SplitInfo:
    """One split: its shards in index order and their totals.

    `label_counts` is {class name (or id, as text, for numeric labels): records}, in label-id
    order, every class named in the manifest's `labels` included; None when the dataset has no
    labels or was written before recordforge counted them.
    """

    shards: tuple[ShardInfo, ...]
    label_counts: Mapping[str, int] | None = None

    @property
    def num_records(self) -> int:
        return sum(shard.num_records for shard in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(shard.num_bytes for shard in self.shards)

    def to_dict(self) -> dict:
        return {
            "num_records": self.num_records,
            "num_bytes": self.num_bytes,
            "num_shards": len(self.shards),
            **({"label_counts": dict(self.label_counts)} if self.label_counts is not None else {}),
            "shards": [shard.to_dict() for shard in self.shards],
        }


@dataclass(frozen=True)
class ErrorSummary:
    """The quarantine: how many inputs failed, where their lines are, and counts by stage/kind."""

    count: int = 0
    files: tuple[str, ...] = ()
    by_stage: Mapping[str, int] = field(default_factory=dict)
    by_kind: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "count": self.count,
            "files": list(self.files),
            "by_stage": dict(sorted(self.by_stage.items())),
            "by_kind": dict(sorted(self.by_kind.items())),
        }


@dataclass(frozen=True)
class Manifest:
    """Everything `dataset_info.json` says. `to_json` is deterministic apart from `created`."""

    name: str
    tool_version: str
    created: str
    num_inputs: int
    splits: Mapping[str, SplitInfo]
    features: Mapping[str, FeatureSpec]
    labels: tuple[str, ...] | None
    plan: Mapping
    errors: ErrorSummary
    compression: str
    options: Mapping
    source: Mapping = field(default_factory=dict)

    @property
    def num_records(self) -> int:
        return sum(split.num_records for split in self.splits.values())

    def counts_add_up(self) -> bool:
        """Nothing lost: every input is a record or an error."""
        return self.num_inputs == self.num_records + self.errors.count

    def to_dict(self) -> dict:
        return {
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "tool": {"name": "recordforge", "version": self.tool_version},
            "created": self.created,
            "num_inputs": self.num_inputs,
            "num_records": self.num_records,
            "compression": self.compression,
            "splits": {name: split.to_dict() for name, split in self.splits.items()},
            "features": {key: spec.to_dict() for key, spec in sorted(self.features.items())},
            "labels": list(self.labels) if self.labels is not None else None,
            "plan": self.plan,
            "errors": self.errors.to_dict(),
            "source": self.source,
            "options": self.options,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: Mapping) -> Manifest:
        return cls(
            name=data["name"],
            tool_version=data["tool"]["version"],
            created=data["created"],
            num_inputs=data["num_inputs"],
            splits={
                name: SplitInfo(
                    tuple(ShardInfo(**shard) for shard in split["shards"]),
                    split.get("label_counts"),  # absent in manifests of earlier versions
                )
                for name, split in data["splits"].items()
            },
            features={key: FeatureSpec.from_dict(s) for key, s in data["features"].items()},
            labels=tuple(data["labels"]) if data["labels"] is not None else None,
            plan=data["plan"],
            errors=ErrorSummary(
                count=data["errors"]["count"],
                files=tuple(inside_the_dataset(name) for name in data["errors"]["files"]),
                by_stage=data["errors"]["by_stage"],
                by_kind=data["errors"]["by_kind"],
            ),
            compression=data["compression"],
            options=data["options"],
            source=data.get("source", {}),
        )
