"""What a listing skips without converting it, counted for the manifest: nothing vanishes."""

from __future__ import annotations

from collections.abc import Mapping

HIDDEN = "hidden"  # a hidden file or one in a hidden folder (.DS_Store, .git/...)
DUPLICATES = "duplicates"  # a file reached a second time (see core.files.overlap)
FOLDER_LINKS = "folder_links"  # a link to a folder, not followed (or leading to one walked)
REASONS = (HIDDEN, DUPLICATES, FOLDER_LINKS)


def source_fields(counts: Mapping[str, int]) -> dict[str, int]:
    """The manifest's `source` entries for skipped paths, by reason.

    `ignored_hidden_files` is always there; the others only when something was skipped for
    them, so that the manifest of a run without them is as it always was.
    """
    fields = {"ignored_hidden_files": counts.get(HIDDEN, 0)}
    if counts.get(DUPLICATES):
        fields["duplicate_files"] = counts[DUPLICATES]
    if counts.get(FOLDER_LINKS):
        fields["symlinked_folders_not_followed"] = counts[FOLDER_LINKS]
    return fields
