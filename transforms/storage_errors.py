"""What Beam FileSystems raise for a missing or forbidden file, on any store.

Local files raise OSError and Beam wraps some failures in BeamIOError, but Beam's GCS filesystem
lets the storage client's own exceptions through (a missing object is
`google.api_core.exceptions.NotFound`, not FileNotFoundError). Those two are facts about the
input, to be reported against it; other errors (throttling, outages) propagate so the runner
retries the work.
"""

from __future__ import annotations

from apache_beam.io.filesystem import BeamIOError


def _object_store_errors() -> tuple[type[BaseException], ...]:
    try:  # installed with apache-beam[gcp]; absent from a Beam without the GCP extra
        from google.api_core.exceptions import Forbidden, NotFound
    except ImportError:
        return ()
    return (NotFound, Forbidden)


STORAGE_ERRORS: tuple[type[BaseException], ...] = (OSError, BeamIOError, *_object_store_errors())
