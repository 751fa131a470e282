"""TFRecord: framing (one record, or a column of them), reading files others wrote, which split
an input file belongs to, and records that arrive serialized."""
