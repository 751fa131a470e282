"""Building records: labels and splits resolved, the Example built (minus image bytes), sized."""

from __future__ import annotations

import collections

import apache_beam as beam
import pyarrow as pa

from recordforge.schemas import codec
from recordforge.schemas import features as keys
from recordforge.schemas.example_size import example_size
from recordforge.schemas.features import FeatureTally
from recordforge.schemas.spliced import serialize_around, widen_empty_value
from recordforge.transforms.combiners import TallyCombineFn
from recordforge.transforms.core.errors import InputError
from recordforge.transforms.core.files.filenames import name_bytes
from recordforge.transforms.core.images.preprocess import NO_PREPROCESSING, Preprocessing
from recordforge.transforms.core.images.probe import DEFAULT_MAX_PIXELS
from recordforge.transforms.core.images.records import (
    plan_image_records,
    plannable_in_bulk,
    record_label,
    source_of,
)
from recordforge.transforms.core.planning.keys import SplitChooser, order_key
from recordforge.transforms.core.planning.labels import LabelMap, LabelTally, resolve_labels
from recordforge.transforms.core.records import (
    STAGE_RECORD,
    Candidate,
    ErrorRecord,
    ImageInfo,
    RecordRef,
    ref_batch,
)
from recordforge.transforms.core.tfrecord.framing import FRAMING_BYTES
from recordforge.transforms.internals import in_global_window

ERRORS = "errors"
TALLY = "tally"


class CollectLabels(beam.PTransform):
    """Batches of probed candidates → the run's LabelMap (one element, for a side input).

    Input: PCollection[list[tuple[Candidate, ImageInfo | None]]].
    """

    def __init__(
        self, folder_sources, csv_sources, mode: str, csv_labelled: bool, stray_files="error"
    ) -> None:
        super().__init__()
        self._args = (tuple(folder_sources), tuple(csv_sources), mode, csv_labelled, stray_files)

    def expand(self, probed):
        folder_sources, csv_sources, mode, csv_labelled, stray_files = self._args
        return (
            probed
            | "LabelFacts" >> beam.Map(_label_facts, frozenset(folder_sources))
            | "TallyLabels" >> beam.CombineGlobally(TallyCombineFn(LabelTally, _add_label_facts))
            | "ResolveLabels"
            >> beam.Map(
                resolve_labels, folder_sources, csv_sources, mode, csv_labelled, stray_files
            )
        )


def _add_label_facts(tally: LabelTally, batch_facts) -> None:
    for facts, times in batch_facts:
        tally.add(*facts, times=times)


def _label_facts(batch: list[tuple[Candidate, ImageInfo | None]], folder_sources: frozenset[int]):
    """((source, depth, label), how many candidates) of a batch's candidates."""
    facts = collections.Counter()
    for packed, _ in batch:
        candidate = Candidate._make(packed)
        source = source_of(candidate)
        depth = candidate.depth if source in folder_sources else None
        facts[(source, depth, candidate.label)] += 1
    return list(facts.items())


class BuildRecords(beam.PTransform):
    """Batches of (Candidate, ImageInfo | None) → columnar batches of RecordRefs.

    Outputs (tagged):
        main: PCollection[pyarrow.RecordBatch] of RecordRefs (records.ref_batch).
        errors: PCollection[ErrorRecord] (e.g. a file outside any class folder).
        tally: PCollection[FeatureTally], partial counts of which features records hold.
    """

    def __init__(
        self,
        label_map,
        *,
        splits,
        salt: str,
        csv_keys=(),
        with_examples: bool = True,
        preprocessing: Preprocessing = NO_PREPROCESSING,
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ) -> None:
        super().__init__()
        self._label_map = label_map
        self._args = (
            tuple(splits),
            salt,
            tuple(csv_keys),
            with_examples,
            preprocessing,
            max_pixels,
        )

    def expand(self, probed):
        return probed | "BuildRecord" >> beam.ParDo(
            _BuildRecordFn(*self._args),
            beam.pvalue.AsSingleton(self._label_map),
        ).with_outputs(ERRORS, TALLY, main="records")


class RecordBuilder:
    """Builds records one after another and tallies their features (used inside DoFns).

    Args:
        splits: (split, fraction) pairs for hash-based splits.
        salt: salts the split and order hashes.
        csv_keys: the CSV feature columns that `Candidate.feature_counts` counts.
        with_examples: False when only planning: records of image files then carry their
            exact size but no serialized Example (see build_record).
        preprocessing: what the writer will do to each image; the records then describe the
            stored image as predicted (transforms.core.images.preprocess), sized by an estimate.
        max_pixels: the pixel limit, which a resized image must also keep.
    """

    def __init__(
        self,
        splits,
        salt: str,
        csv_keys: tuple[str, ...],
        with_examples: bool = True,
        preprocessing: Preprocessing = NO_PREPROCESSING,
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ) -> None:
        self._preprocessing = preprocessing if preprocessing.active else None
        self._max_pixels = max_pixels
        self._chooser = SplitChooser(tuple(splits), salt)
        self._salt = salt
        self._csv_keys = tuple(csv_keys)
        self._with_examples = with_examples
        # Records with the same (key, count) list are tallied once, with how many there were.
        self._shapes: collections.Counter = collections.Counter()
        # (format, channels, width, height) of the images of records built, likewise.
        self._images: collections.Counter = collections.Counter()
        self._encoders: dict = {}  # Example templates by feature keys (see build_record)

    def build(
        self, candidate: Candidate, image: ImageInfo | None, label_map: LabelMap
    ) -> RecordRef | ErrorRecord:
        """The candidate's record, or its error record when it cannot become one."""
        try:
            if image is not None and self._preprocessing is not None:
                image = stored_image(image, self._preprocessing, self._max_pixels)
            ref, counts = build_record(
                candidate,
                image,
                label_map,
                self._chooser,
                self._salt,
                self._csv_keys,
                encoders=self._encoders,
                with_example=self._with_examples,
            )
        except InputError as error:
            return ErrorRecord(
                candidate.path, candidate.row, STAGE_RECORD, error.kind, error.message
            )
        self._shapes[counts] += 1
        if image is not None:
            self._images[image.format, image.channels, image.width, image.height] += 1
        return ref

    def build_batch(
        self, batch: list[tuple[tuple, tuple | None]], label_map: LabelMap
    ) -> tuple[pa.RecordBatch | None, list[ErrorRecord]]:
        """A batch of packed (Candidate, ImageInfo | None) → (records as one batch, errors)."""
        rows = [
            (Candidate._make(packed), None if image is None else ImageInfo._make(image))
            for packed, image in batch
        ]
        if (
            not self._with_examples
            and self._preprocessing is None
            and all(plannable_in_bulk(*row) for row in rows)
        ):
            # Planning image files: the whole batch sized at once, the same records.
            records, errors, shapes = plan_image_records(
                rows, label_map, self._chooser, self._salt, self._csv_keys
            )
            self._shapes.update(shapes)
            failed = {(error.path, error.row) for error in errors}
            self._images.update(
                (image.format, image.channels, image.width, image.height)
                for candidate, image in rows
                if (candidate.path, candidate.row) not in failed
            )
            return records, errors
        refs, errors = [], []
        for candidate, image in rows:
            built = self.build(candidate, image, label_map)
            (errors if isinstance(built, ErrorRecord) else refs).append(built)
        return (ref_batch(refs) if refs else None), errors

    def tally_output(self) -> beam.pvalue.TaggedOutput:
        """The tally of the records built since the last call, as a TALLY output."""
        tally = FeatureTally()
        for counts, times in self._shapes.items():
            tally.add(counts, times)
        for facts, times in self._images.items():
            tally.images.add(*facts, times=times)
        self._shapes.clear()
        self._images.clear()
        return beam.pvalue.TaggedOutput(TALLY, in_global_window(tally))


class _BuildRecordFn(beam.DoFn):
    def __init__(self, *args) -> None:
        self._args = args  # RecordBuilder's

    def setup(self):
        self._builder = RecordBuilder(*self._args)

    def process(self, batch, label_map: LabelMap):
        records, errors = self._builder.build_batch(batch, label_map)
        for error in errors:
            yield beam.pvalue.TaggedOutput(ERRORS, error)
        if records is not None:
            yield records

    def finish_bundle(self):
        yield self._builder.tally_output()  # one tally per bundle, not an element per record


def build_record(
    candidate: Candidate,
    image: ImageInfo | None,
    label_map: LabelMap,
    chooser: SplitChooser,
    salt: str,
    csv_keys: tuple[str, ...] = (),
    encoders: dict | None = None,
    with_example: bool = True,
) -> tuple[RecordRef, tuple[tuple[str, int], ...]]:
    """The record a candidate becomes, and ((key, value count), ...) of its features.

    `csv_keys` names the CSV feature columns that `candidate.feature_counts` counts.
    `encoders` keeps Example templates from record to record (one per set of keys); records of
    image files are built ten times faster by refilling one than by building an Example.
    Without `with_example` (planning only), the record of an image file gets its exact size
    computed from its values (schemas.example_size) and an empty `example`: planning needs no
    more, and serializing is most of the cost of building.
    """
    features = {}
    label_key, text_key = (
        (keys.IMAGE_LABEL, keys.IMAGE_LABEL_TEXT) if image else (keys.LABEL, keys.LABEL_TEXT)
    )
    label, text = record_label(candidate, label_map)
    if label is not None:
        features[label_key] = ("int64", (label,))
        if text is not None:
            features[text_key] = ("bytes", (text.encode("utf-8"),))
    if image is not None:
        features[keys.IMAGE_FORMAT] = ("bytes", (image.format.encode("ascii"),))
        features[keys.IMAGE_HEIGHT] = ("int64", (image.height,))
        features[keys.IMAGE_WIDTH] = ("int64", (image.width,))
        features[keys.IMAGE_CHANNELS] = ("int64", (image.channels,))
        features[keys.IMAGE_FILENAME] = ("bytes", (name_bytes(candidate.image_name),))
    counts = [(k, n) for k, n in zip(csv_keys, candidate.feature_counts, strict=True) if n >= 0]
    counts += ((key, len(values)) for key, (_, values) in features.items())
    # Image records get a hole the image's size: exact for planning, and the writer drops the
    # file's bytes in without building the Example again.
    payload_offset = 0
    sized = None  # the serialized Example's size without the image bytes, when not serialized
    if image is not None and not candidate.features and not with_example:
        data = b""
        sized = example_size(features, {keys.IMAGE_ENCODED: image.size}) - image.size
    elif image is not None and not candidate.features:  # an image file: the same few keys
        data, payload_offset = _serialize_image_record(features, image.size, encoders)
    elif features:
        example = codec.parse(candidate.features)
        codec.add_features(example, features)  # preflight keeps CSV feature names off these
        if image is not None:
            data, payload_offset = serialize_around(example, keys.IMAGE_ENCODED, image.size)
        else:
            data = codec.serialize(example)
    else:  # CSV cells only: already serialized, deterministically
        data = candidate.features
    size = (
        (len(data) if sized is None else sized)
        + (image.size if image is not None else 0)
        + FRAMING_BYTES
    )
    if image is not None:
        counts.append((keys.IMAGE_ENCODED, 1))
    split = candidate.split or chooser.choose(candidate.key)
    ref = RecordRef(
        split=split,
        order=order_key(salt, candidate.key),
        size=size,
        example=data,
        payload_path=candidate.image_path if image is not None else None,
        payload_size=_source_size(image),
        path=candidate.path,
        row=candidate.row,
        label=label,
        payload_offset=payload_offset,
        payload_version=image.version if image is not None else -1,
    )
    return ref, tuple(counts)


def stored_image(image: ImageInfo, preprocessing: Preprocessing, max_pixels: int) -> ImageInfo:
    """The ImageInfo a record is planned with when the writer preprocesses its image: the stored
    image's predicted facts, its size estimated, the source's size kept apart for the writer's
    FileChanged check (`source_size`)."""
    stored = preprocessing.stored_facts(
        image.format, image.width, image.height, image.channels, max_pixels, image.orientation
    )
    estimate = preprocessing.estimated_size(
        image.size, image.format, image.width * image.height, stored
    )
    return image._replace(
        size=estimate,
        format=stored[0],
        width=stored[1],
        height=stored[2],
        channels=stored[3],
        source_size=image.size,
    )


def _serialize_image_record(features: dict, image_size: int, encoders: dict | None):
    """`serialize_around` for an image file's record, by refilling a template Example."""
    spec = (*((key, dtype) for key, (dtype, _) in features.items()), (keys.IMAGE_ENCODED, "bytes"))
    encoders = {} if encoders is None else encoders
    encoder = encoders.get(spec)
    if encoder is None:
        encoder = encoders[spec] = codec.ExampleEncoder(spec)
    serialized = encoder.encode([values for _, values in features.values()] + [(b"",)])
    return widen_empty_value(serialized, keys.IMAGE_ENCODED, image_size)


def _source_size(image: ImageInfo | None) -> int:
    """The size of the file the writer reads: the probed file's, also when the stored image is
    another (preprocessing)."""
    if image is None:
        return 0
    return image.size if image.source_size < 0 else image.source_size
