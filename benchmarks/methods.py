"""The methods the benchmark compares; each run is a fresh interpreter running this file.

    python benchmarks/methods.py METHOD --input SRC --output DIR --report REPORT.json [...]

METHOD is one of:

- tutorial-images, tutorial-csv: the TensorFlow tutorial's way ("TFRecord and tf.train.Example"):
  a Python loop building one tf.train.Example per input, written with tf.io.TFRecordWriter; an
  image's shape comes from tf.io.decode_jpeg, CSV rows are read with the csv module.
- beam-images, beam-csv: a naive Apache Beam pipeline on the FnApiRunner in this process (the
  runner recordforge uses by default): read bytes (fileio / ReadFromText) -> Example ->
  beam.io.WriteToTFRecord.
- raw-images, raw-csv: the raw limit: read every input byte and write TFRecord-framed records
  (length, masked CRC32C of the length, data, masked CRC32C of the data), nothing else.
- recordforge: `recordforge ARGS...` (everything after the method name), run through the
  console script's own entry point, recordforge.command.main() (sys.argv holding ARGS), so
  that what the program does before and after the CLI is measured too: the imports it
  refuses, the workers' fork server started before Beam is imported, the exit without the
  interpreter's teardown.

This file is run as a script, never imported by the harness, and imports nothing from the harness:
the interpreter's startup and imports are part of what is measured. The report file gets
`startup_s`, the seconds from the harness's launch (BENCH_T0, a time.time() value) until this
method's modules were imported (for recordforge, until its CLI module was), and
`records_written`, as the method itself counted them (the harness counts again from the files).
"""

from __future__ import annotations

import argparse
import csv
import importlib.abc
import importlib.util
import json
import os
import struct
import sys
import time

# Run as a script, this file's folder would come first on sys.path, before the libraries it
# measures; nothing there is meant to be imported by them.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

# How the tutorial and the naive pipeline type a CSV column: what the data generator declared
# (columns.json beside the CSV); recordforge infers the same types itself.
INT64, FLOAT, BYTES = "int64", "float", "bytes"


def _startup(report: dict) -> None:
    t0 = float(os.environ.get("BENCH_T0", "0") or 0)
    report["startup_s"] = round(time.time() - t0, 3) if t0 else None


def _own_peak_rss(report: dict) -> None:
    """This process's peak RSS since it started this interpreter (Linux's VmHWM), in bytes.

    The harness samples memory every 50 ms; this catches a peak it missed in a short run.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    report["vm_hwm_bytes"] = int(line.split()[1]) * 1024
    except OSError:
        pass


def _image_files(root: str) -> list[tuple[str, str]]:
    """(path, class folder name) of every file in root/<class>/, sorted."""
    files = []
    for label in sorted(os.listdir(root)):
        folder = os.path.join(root, label)
        if os.path.isdir(folder) and not label.startswith("."):
            files += [
                (os.path.join(folder, name), label)
                for name in sorted(os.listdir(folder))
                if not name.startswith(".")
            ]
    return files


def _csv_columns(path: str) -> dict[str, str]:
    with open(os.path.join(os.path.dirname(path), "columns.json")) as f:
        return json.load(f)


# --- 1. the tutorial way -------------------------------------------------------------------------


def tutorial_images(args, report: dict) -> None:
    import tensorflow as tf

    _startup(report)

    # As in https://www.tensorflow.org/tutorials/load_data/tfrecord ("Walkthrough: Reading and
    # writing image data"), with one TFRecord file and the class index as the label.
    def _bytes_feature(value):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def _int64_feature(value):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    def image_example(image_string, label):
        image_shape = tf.io.decode_jpeg(image_string).shape
        feature = {
            "height": _int64_feature(image_shape[0]),
            "width": _int64_feature(image_shape[1]),
            "depth": _int64_feature(image_shape[2]),
            "label": _int64_feature(label),
            "image_raw": _bytes_feature(image_string),
        }
        return tf.train.Example(features=tf.train.Features(feature=feature))

    files = _image_files(args.input)
    classes = {name: index for index, name in enumerate(sorted({label for _, label in files}))}
    count = 0
    record_file = os.path.join(args.output, "images.tfrecords")
    with tf.io.TFRecordWriter(record_file) as writer:
        for path, label in files:
            image_string = open(path, "rb").read()
            tf_example = image_example(image_string, classes[label])
            writer.write(tf_example.SerializeToString())
            count += 1
    report["records_written"] = count


def _csv_feature(tf, dtype: str, cell: str):
    if dtype == INT64:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(cell)]))
    if dtype == FLOAT:
        return tf.train.Feature(float_list=tf.train.FloatList(value=[float(cell)]))
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[cell.encode("utf-8")]))


def tutorial_csv(args, report: dict) -> None:
    import tensorflow as tf

    _startup(report)
    columns = _csv_columns(args.input)
    count = 0
    with (
        open(args.input, newline="", encoding="utf-8") as f,
        tf.io.TFRecordWriter(os.path.join(args.output, "table.tfrecords")) as writer,
    ):
        reader = csv.reader(f)
        header = next(reader)
        dtypes = [columns[name] for name in header]
        for row in reader:
            feature = {
                name: _csv_feature(tf, dtype, cell)
                for name, dtype, cell in zip(header, dtypes, row, strict=True)
                if cell != ""  # an empty cell: the feature is left out
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())
            count += 1
    report["records_written"] = count


# --- 2. a naive Beam pipeline --------------------------------------------------------------------


def _beam_pipeline():
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    return beam.Pipeline(runner=FnApiRunner(), options=PipelineOptions([]))


def beam_images(args, report: dict) -> None:
    import apache_beam as beam
    import tensorflow as tf
    from apache_beam.io import fileio

    _startup(report)
    classes = sorted(
        name
        for name in os.listdir(args.input)
        if os.path.isdir(os.path.join(args.input, name)) and not name.startswith(".")
    )
    class_ids = {name: index for index, name in enumerate(classes)}

    def to_example(readable) -> bytes:
        data = readable.read()
        path = readable.metadata.path
        label = os.path.basename(os.path.dirname(path))
        example = tf.train.Example()
        feature = example.features.feature
        feature["image/encoded"].bytes_list.value.append(data)
        feature["image/filename"].bytes_list.value.append(path.encode("utf-8"))
        feature["image/class/label"].int64_list.value.append(class_ids[label])
        return example.SerializeToString()

    with _beam_pipeline() as pipeline:
        _ = (
            pipeline
            | fileio.MatchFiles(os.path.join(args.input, "*", "*"))
            | fileio.ReadMatches()
            | beam.Map(to_example)
            | beam.io.WriteToTFRecord(
                os.path.join(args.output, "images"), file_name_suffix=".tfrecord"
            )
        )


def beam_csv(args, report: dict) -> None:
    import apache_beam as beam
    import tensorflow as tf

    _startup(report)
    columns = _csv_columns(args.input)
    with open(args.input, newline="", encoding="utf-8") as f:
        header = next(csv.reader(f))
    dtypes = [columns[name] for name in header]

    def to_example(line: str) -> bytes:
        row = next(csv.reader([line]))
        example = tf.train.Example()
        feature = example.features.feature
        for name, dtype, cell in zip(header, dtypes, row, strict=True):
            if cell == "":
                continue
            if dtype == INT64:
                feature[name].int64_list.value.append(int(cell))
            elif dtype == FLOAT:
                feature[name].float_list.value.append(float(cell))
            else:
                feature[name].bytes_list.value.append(cell.encode("utf-8"))
        return example.SerializeToString()

    with _beam_pipeline() as pipeline:
        _ = (
            pipeline
            | beam.io.ReadFromText(args.input, skip_header_lines=1)
            | beam.Map(to_example)
            | beam.io.WriteToTFRecord(
                os.path.join(args.output, "table"), file_name_suffix=".tfrecord"
            )
        )


# --- 4. the raw limit ----------------------------------------------------------------------------

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")


def _framer():
    import google_crc32c

    value = google_crc32c.value

    def frame(data: bytes) -> bytes:
        length = _LENGTH.pack(len(data))
        masked = [
            ((((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)
            for crc in (value(length), value(data))
        ]
        return b"".join((length, _CRC.pack(masked[0]), data, _CRC.pack(masked[1])))

    return frame


def raw_images(args, report: dict) -> None:
    frame = _framer()
    _startup(report)
    count = 0
    with open(os.path.join(args.output, "images.tfrecord"), "wb") as out:
        for path, _ in _image_files(args.input):
            with open(path, "rb") as f:
                out.write(frame(f.read()))
            count += 1
    report["records_written"] = count


def raw_csv(args, report: dict) -> None:
    frame = _framer()
    _startup(report)
    count = 0
    with (
        open(args.input, "rb") as f,
        open(os.path.join(args.output, "table.tfrecord"), "wb") as out,
    ):
        f.readline()  # the header
        for line in f:  # the generated CSV has no newline inside a quoted field
            out.write(frame(line.rstrip(b"\r\n")))
            count += 1
    report["records_written"] = count


# --- 3. recordforge ------------------------------------------------------------------------------


def recordforge(argv: list[str], report: dict) -> int:
    from recordforge.command import main

    # command.main() imports the CLI (and Beam) itself, after refusing what it never uses.
    sys.meta_path.insert(0, _NoteWhenImported("recordforge.pipelines.cli", report))
    sys.argv = ["recordforge", *argv]
    return main()


class _NoteWhenImported(importlib.abc.MetaPathFinder):
    """Notes `startup_s` once the module `name` has been imported, then steps aside."""

    def __init__(self, name: str, report: dict) -> None:
        self._name, self._report = name, report

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _startup(self._report)

        spec.loader.exec_module = exec_module
        return spec


METHODS = {
    "tutorial-images": tutorial_images,
    "tutorial-csv": tutorial_csv,
    "beam-images": beam_images,
    "beam-csv": beam_csv,
    "raw-images": raw_images,
    "raw-csv": raw_csv,
}


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "recordforge" and argv[1] == "--report":
        report_path, report = argv[2], {}
        try:
            return recordforge(argv[3:], report)
        finally:
            _own_peak_rss(report)
            with open(report_path, "w") as f:
                json.dump(report, f)
    parser = argparse.ArgumentParser(prog="methods.py")
    parser.add_argument("method", choices=sorted(METHODS))
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--report", required=True)
    args = parser.parse_args(argv)
    os.makedirs(args.output, exist_ok=True)
    report: dict = {}
    METHODS[args.method](args, report)
    _own_peak_rss(report)
    with open(args.report, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
