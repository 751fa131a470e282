"""The features a conversion declares up front: image keys, label keys and CSV columns."""

from __future__ import annotations

from recordforge.schemas import features as keys
from recordforge.schemas.csv.schema import ColumnSpec, CsvSchema
from recordforge.schemas.features import DeclaredFeature
from recordforge.transforms.core.records import CsvRoles

_IMAGE_FEATURES = (
    DeclaredFeature(keys.IMAGE_ENCODED, "bytes", description="the original image file's bytes"),
    DeclaredFeature(keys.IMAGE_FORMAT, "bytes", description="jpeg, png, gif, bmp or webp"),
    DeclaredFeature(keys.IMAGE_HEIGHT, "int64", description="height in pixels"),
    DeclaredFeature(keys.IMAGE_WIDTH, "int64", description="width in pixels"),
    DeclaredFeature(keys.IMAGE_CHANNELS, "int64", description="channels when decoded"),
    DeclaredFeature(keys.IMAGE_FILENAME, "bytes", description="path relative to the source"),
)


_PREPROCESSED_IMAGE = DeclaredFeature(
    keys.IMAGE_ENCODED,
    "bytes",
    description="the image re-encoded as the manifest's options.preprocessing says",
)


def declare_features(
    *, has_images: bool, schema: CsvSchema | None, roles: CsvRoles, preprocessed: bool = False
) -> tuple[DeclaredFeature, ...]:
    """Every feature a run may write, in a stable order. `preprocessed`: the images are stored
    resized or re-encoded, not as their files were."""
    declared = list(_IMAGE_FEATURES) if has_images else []
    if declared and preprocessed:
        declared[0] = _PREPROCESSED_IMAGE
    label_key, text_key = (
        (keys.IMAGE_LABEL, keys.IMAGE_LABEL_TEXT) if has_images else (keys.LABEL, keys.LABEL_TEXT)
    )
    declared.append(
        DeclaredFeature(label_key, "int64", description="class id", listed_when_absent=False)
    )
    declared.append(
        DeclaredFeature(text_key, "bytes", description="class name", listed_when_absent=False)
    )
    for column in csv_feature_columns(schema, roles):
        declared.append(
            DeclaredFeature(
                column.feature,
                column.dtype,
                is_list=column.is_list,
                description=f"CSV column {column.column!r}",
            )
        )
    return tuple(declared)


def csv_feature_columns(schema: CsvSchema | None, roles: CsvRoles) -> tuple[ColumnSpec, ...]:
    """The CSV columns that become features (not the image, label or split column), in order."""
    special = {roles.image_column, roles.label_column, roles.split_column}
    columns = schema.columns if schema is not None else ()
    return tuple(column for column in columns if column.column not in special)
