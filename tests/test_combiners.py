"""CombineTogether: several global combines run as one give what each gives on its own."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from recordforge.schemas.features import FeatureTally
from recordforge.transforms.combiners import CombineTogether, TallyCombineFn


def _run(build, *flags: str) -> None:
    with beam.Pipeline(options=PipelineOptions(list(flags))) as pipeline:
        build(pipeline)


@pytest.mark.parametrize(
    "flags",
    [(), ("--direct_num_workers=2", "--direct_running_mode=multi_threading")],
    ids=["one-worker", "two-workers"],
)
def test_each_output_is_what_its_own_global_combine_gives(flags):
    numbers = list(range(1, 301))
    words = ["a", "bb", "ccc"] * 40

    def build(pipeline):
        evens = pipeline | "Evens" >> beam.Create([n for n in numbers if n % 2 == 0])
        odds = pipeline | "Odds" >> beam.Create([n for n in numbers if n % 2])
        texts = pipeline | "Texts" >> beam.Create(words)
        together = pipeline | "Together" >> CombineTogether(
            {
                # A tuple of PCollections is combined as one.
                "Sum": ((evens, odds), sum),
                "Longest": (texts, beam.combiners.TopCombineFn(1, key=len)),
                "Counts": (
                    texts | beam.Map(lambda word: (1, len(word))),
                    beam.combiners.TupleCombineFn(sum, sum),
                ),
            }
        )
        assert_that(together["Sum"], equal_to([sum(numbers)]), label="CheckSum")
        assert_that(together["Longest"], equal_to([["ccc"]]), label="CheckLongest")
        assert_that(
            together["Counts"],
            equal_to([(len(words), sum(map(len, words)))]),
            label="CheckCounts",
        )

    _run(build, *flags)


def test_an_empty_input_gives_its_combines_default_as_a_global_combine_does():
    def build(pipeline):
        empty = pipeline | "Empty" >> beam.Create([]).with_output_types(int)
        some = pipeline | "Some" >> beam.Create([2, 3])
        together = pipeline | "Together" >> CombineTogether(
            {"Nothing": (empty, sum), "Something": (some, sum)}
        )
        alone = empty | "Alone" >> beam.CombineGlobally(sum)
        assert_that(together["Nothing"], equal_to([0]), label="CheckNothing")
        assert_that(alone, equal_to([0]), label="CheckAlone")
        assert_that(together["Something"], equal_to([5]), label="CheckSomething")

    _run(build)


def test_tally_objects_are_merged_across_bundles_as_by_their_own_combine():
    # FeatureTally accumulators, as the conversion's feature tally uses them.
    records = [(("image/encoded", "bytes", 1),), (("label", "int64", 1), ("x", "float", 3))] * 50

    def tally_of(facts_list):
        tally = FeatureTally()
        for facts in facts_list:
            tally.add_typed(facts, 1)
        return tally

    def build(pipeline):
        tallies = (
            pipeline
            | "Records" >> beam.Create([records[i : i + 7] for i in range(0, len(records), 7)])
            | "TallyEach" >> beam.Map(tally_of)
        )
        combine = TallyCombineFn(FeatureTally, FeatureTally.merge)
        together = pipeline | "Together" >> CombineTogether({"Features": (tallies, combine)})
        alone = tallies | "Alone" >> beam.CombineGlobally(combine)
        expected = _counted(tally_of(records))
        assert expected == (
            100,
            {"image/encoded": [50, 1, 1], "label": [50, 1, 1], "x": [50, 3, 3]},
        )
        assert_that(
            together["Features"] | "Counted" >> beam.Map(_counted),
            equal_to([expected]),
            label="CheckTogether",
        )
        assert_that(
            alone | "AloneCounted" >> beam.Map(_counted), equal_to([expected]), label="CheckAlone"
        )

    _run(build, "--direct_num_workers=2", "--direct_running_mode=multi_threading")


def _counted(tally: FeatureTally):
    return tally.num_records, tally.keys
