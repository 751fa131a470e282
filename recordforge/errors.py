"""The exceptions recordforge's library calls raise.

    RecordforgeError
    ├── UsageError (also a ValueError): a bad option, source, output or dataset folder;
    │   │                               nothing was written
    │   └── UntestedBeamVersion: the installed Beam is not the release recordforge uses the
    │                            internals of (transforms/internals.py)
    ├── RunFailed: the run refused to finish and wrote no manifest
    │   ├── ErrorRateExceeded: more inputs failed than max_error_rate allows
    │   ├── InputChanged: an input changed while the run read it
    │   ├── InputIncomplete: an input could not be read to its end
    │   └── OutputTaken: a dataset appeared in the output folder during a run not told to
    │                    overwrite one; it was left as it is
    └── VerifyFailed: `verify(..., check=True)` found problems (`.report` lists them)

    MixedFeatureTypes (a ValueError, from the pure schemas layer): the records' feature types
    disagree (reshard, WriteDataset); the run refused to commit, as a RunFailed does.

Anything else (a runner that lost its workers, a bug) propagates as the runner raised it. The
`recordforge` command turns UsageError into exit status 2 and the refusals into 1.
"""

from recordforge.schemas.features import MixedFeatureTypes
from recordforge.transforms.core.errors import (
    ErrorRateExceeded,
    InputChanged,
    InputIncomplete,
    OutputTaken,
    RecordforgeError,
    RunFailed,
    UsageError,
    VerifyFailed,
)
from recordforge.transforms.internals import UntestedBeamVersion

__all__ = [
    "ErrorRateExceeded",
    "InputChanged",
    "InputIncomplete",
    "MixedFeatureTypes",
    "OutputTaken",
    "RecordforgeError",
    "RunFailed",
    "UntestedBeamVersion",
    "UsageError",
    "VerifyFailed",
]
