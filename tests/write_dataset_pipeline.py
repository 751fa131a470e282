"""A user's Beam pipeline ending in recordforge.WriteDataset (tests/test_write_dataset.py runs it).

`python write_dataset_pipeline.py OUT [Beam options]`: a few transforms of the user's own make
records of every kind WriteDataset takes (serialized Examples, dicts, (split, record) pairs),
and some it cannot use, then write them. The records depend on their number alone, so every
runner gets the same ones (in whatever order and bundles it likes).
"""

from __future__ import annotations

import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

import recordforge
from recordforge.schemas import codec

NUM_ELEMENTS = 3000


def make_record(i: int):
    """The record of element i: every fifth a serialized Example, every fifth a pair, ..."""
    text = f"row {i} " * (i % 23)
    if i % 97 == 13:
        return b"\x08\x96\x01 not an Example"  # bytes that are no tf.train.Example
    if i % 101 == 7:
        return [i]  # not a record at all
    if i % 5 == 0:
        features = {
            "id": ("int64", [i]),
            "score": ("float", [i / 7]),
            "text": ("bytes", [text.encode()]),
        }
        return codec.serialize(codec.build_example(features))
    if i % 5 == 1:
        split = "holdout" if i % 3 == 0 else "train"
        return (split, {"id": i, "score": i / 7, "text": text, "tags": ["a", "b"][: i % 3]})
    return {"id": i, "score": i / 7, "text": text, "tags": ["x"] * (i % 4)}


def keep(i: int) -> bool:
    return i % 11 != 3  # the user's own filter, before the records are written


def main(argv: list[str]) -> None:
    out, beam_args = argv[0], argv[1:]
    with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
        _ = (
            pipeline
            | "Numbers" >> beam.Create(range(NUM_ELEMENTS))
            | "Keep" >> beam.Filter(keep)
            | "Spread" >> beam.Reshuffle()
            | "MakeRecords" >> beam.Map(make_record)
            | "Write"
            >> recordforge.WriteDataset(
                out,
                name="ds",
                splits={"train": 0.8, "test": 0.2},
                min_shard_mb=0.05,
                max_shard_mb=0.1,
                num_hosts=2,
            )
        )


if __name__ == "__main__":
    main(sys.argv[1:])
