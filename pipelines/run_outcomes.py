"""How a run that did not end well is told: one line saying why and what the output folder
holds, and the exit status (docs/design.md, "Run-level outcomes").

A reason of the user's world (a refusal raised inside the pipeline, a full disk, a refused
system call, a lost worker or job service) is one line; anything else is logged with its
traceback. What the line says the output folder holds is read from the folder, not assumed.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys

from recordforge.pipelines import api
from recordforge.pipelines import output as output_folder
from recordforge.schemas.features import MixedFeatureTypes
from recordforge.transforms.core.errors import (
    ErrorRateExceeded,
    FileNameTooLong,
    InputChanged,
    InputIncomplete,
    ListingFailed,
    OutOfSpace,
    ResumeRefused,
    RunFailed,
    Stopped,
    WorkerLost,
)
from recordforge.transforms.core.files.filenames import to_os
from recordforge.transforms.core.files.paths import has_scheme
from recordforge.transforms.internals import (
    LOST_SCHEDULER_TEXTS,
    LOST_WORKER_TEXTS,
    failed_step,
    lost_job_service_detail,
)
from recordforge.transforms.staging import commit_in_place, interrupted_commit

LOGGER = logging.getLogger("recordforge")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def report_stop(stop: Stopped | WorkerLost, prepared: output_folder.PreparedOutput) -> int:
    from recordforge.command import stop_worker_processes

    stop_worker_processes()  # any the runner started while it unwound
    if isinstance(stop, WorkerLost):
        lost = f"the runner lost a worker process ({stop.detail})"
        print(f"recordforge: failed: {lost}; {kept(prepared)}", file=sys.stderr)
        return EXIT_FAILED
    print(f"recordforge: stopped by {stop.name}; {kept(prepared)}", file=sys.stderr)
    return stop.exit_status


def only_cleanup_failed(error: BaseException, prepared: output_folder.PreparedOutput) -> bool:
    """Whether the run failed after its commit put its dataset in place, in the cleanup of the
    old copy and the working folder; then the run's work is done, and a warning says what is
    left over."""
    if not _committed_by_this_run(prepared):
        return False
    LOGGER.debug("the cleanup's exception", exc_info=error)  # -v shows it
    print(f"recordforge: warning: {_cleanup_failed(error, prepared)}", file=sys.stderr)
    return True


def _committed_by_this_run(prepared: output_folder.PreparedOutput) -> bool:
    committed = commit_in_place(prepared.staging)
    return committed is not None and committed.get("run_id") == prepared.holder.run_id


def _cleanup_failed(error: BaseException, prepared: output_folder.PreparedOutput) -> str:
    reason = _out_of_space(error) or system_error(error) or f"{type(error).__name__}: {error}"
    return (
        f"the new dataset is in place in {prepared.staging.output}, but the cleanup after its "
        f"commit failed ({reason.splitlines()[0][:300]}); the next run into it finishes that"
    )


def report_failure(error: BaseException, prepared: output_folder.PreparedOutput) -> int:
    """One line for a run that failed for a reason of the user's world, else the traceback."""
    output = prepared.staging.output
    refused = _cause_message(error, (ResumeRefused,))
    if refused:
        print(f"recordforge: error: --resume: {refused}", file=sys.stderr)
        return EXIT_USAGE
    message = _cause_message(error, (ErrorRateExceeded,))
    if message:  # it names the errors files, kept in the working folder
        print(f"recordforge: failed: {message}; {_unchanged(output)}", file=sys.stderr)
        return EXIT_FAILED
    message = (
        _cause_message(
            error,
            (
                InputChanged,
                InputIncomplete,
                ListingFailed,
                MixedFeatureTypes,
                OutOfSpace,
                FileNameTooLong,
            ),
        )
        or _out_of_space(error)
        or _lost_worker(error)
        or _lost_job_service(error)
        or system_error(error)
    )
    if message:
        LOGGER.debug("the run's exception", exc_info=error)  # -v shows it
        print(f"recordforge: failed: {message}; {kept(prepared)}", file=sys.stderr)
        return EXIT_FAILED
    LOGGER.error("the conversion failed; %s", kept(prepared), exc_info=error)
    return EXIT_FAILED


def _unchanged(output: str) -> str:
    if interrupted_commit(output) is not None:
        return f"its commit into {output} was interrupted: run the conversion again to finish it"
    return _as_it_was(output)


def _as_it_was(output: str) -> str:
    """`OUT is as it was`; for a local folder that never existed, that it was not created."""
    if not has_scheme(output) and not os.path.lexists(to_os(output)):
        return f"{output} was not created"
    return f"{output} is as it was"


def kept(prepared: output_folder.PreparedOutput) -> str:
    """What a stopped or failed run leaves, in words."""
    staging = prepared.staging
    output = staging.output
    if _committed_by_this_run(prepared):
        return (
            f"the new dataset is in place in {output}; only the cleanup after its commit was "
            "cut short (the next run into it finishes that)"
        )
    if interrupted_commit(output) is not None:
        again = "the conversion again (or with --resume)" if prepared.resumable else "it again"
        return f"its commit into {output} was cut short: run {again} to finish it"
    if output_folder.cleaned_up_after_commit(staging):
        return f"the new dataset is in place in {output}: the run was stopped after its commit"
    return f"{_as_it_was(output)}; {output_folder.keep_resumable(staging, prepared.resumable)}"


def _cause_message(error: BaseException, refusals: tuple[type[BaseException], ...]) -> str | None:
    """The message of one of `refusals` raised inside the pipeline, else None."""
    refusal = api.refusal_in(error, refusals)
    return None if refusal is None else str(refusal)


def _lost_worker(error: BaseException) -> str | None:
    """One line for a run whose runner lost a worker process or its scheduler, else None."""
    while error is not None:
        text = f"{type(error).__name__}: {error}"
        for marker in LOST_WORKER_TEXTS:
            if marker in text:
                detail = text[text.index(marker) :].splitlines()[0][:200]
                return f"the runner lost a worker process ({detail})"
        for marker in LOST_SCHEDULER_TEXTS:
            if marker in text:
                # Its client's errors, trying to reconnect until it closes, would follow the
                # line that says so.
                logging.getLogger("distributed.client").disabled = True
                detail = text.splitlines()[0][:200]
                return f"the runner lost its Dask scheduler ({detail})"
        error = error.__cause__ or error.__context__
    return None


def _lost_job_service(error: BaseException) -> str | None:
    """One line for a portable run whose job service went away (or stopped answering), else
    None."""
    while error is not None:
        detail = lost_job_service_detail(error)
        if detail is not None:
            return f"the runner lost its job service ({detail})"
        error = error.__cause__ or error.__context__
    return None


_NO_SPACE = re.compile(r"\[Errno (28|122)\] [^:\n]+(?:: '([^'\n]+)')?")


def _out_of_space(error: BaseException) -> str | None:
    """A full disk or quota met outside recordforge's own writers (a spill file, Beam's own
    files), in words; None when `error` is something else."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            code, path = error.errno, error.filename
        else:
            found = _NO_SPACE.search(str(error))
            if found is None:
                error = error.__cause__ or error.__context__
                continue
            code, path = int(found.group(1)), found.group(2)
        reason = "out of disk space" if code == errno.ENOSPC else "out of disk quota"
        return f"{reason} while writing {path or 'a file of the run'}"
    return None


# An OSError as Beam's runners pass it on, as text: "[Errno 5] Input/output error: 'path'".
_OS_ERROR = re.compile(r"\[Errno (\d+)\] ([^:\n\[]+?)(?:: '([^'\n]+)')?\s*(?:\[|$)", re.M)
# Beam's filesystems wrap it in a BeamIOError: "{('src', 'dst'): OSError(PermissionError(13,
# 'Permission denied'))}".
_OS_ERROR_REPR = re.compile(r"(?:\{\(?'([^'\n]+)'[^{}\n]*?)?Error\((\d+), '([^'\n]+)'\)")


def system_error(error: BaseException) -> str | None:
    """A system call the run made that failed (an I/O error of a disk, a permission, a
    read-only or other file system, too many open files), in words: the user's world, not a
    defect of the program; None when `error` carries no such error."""
    step = None
    while error is not None:
        text = str(error)
        step = step or failed_step(text)
        if isinstance(error, OSError) and error.errno:
            code, reason, path = error.errno, error.strerror or "", error.filename
        else:
            found = _OS_ERROR.search(text)
            wrapped = _OS_ERROR_REPR.search(text)
            if found is not None:
                code, reason, path = int(found.group(1)), found.group(2), found.group(3)
            elif wrapped is not None:
                code, reason, path = int(wrapped.group(2)), wrapped.group(3), wrapped.group(1)
            else:
                error = error.__cause__ or error.__context__
                continue
        name = errno.errorcode.get(code, f"errno {code}")
        where = (
            f" at {path}" if path else f" in {step.split('/')[-2]}" if step and "/" in step else ""
        )
        # A name that does not resolve (a negative errno: getaddrinfo's), a connection refused
        # or reset, a timeout: a store the run could not reach.
        network = code < 0 or isinstance(error, (ConnectionError, TimeoutError))
        what = "a network call failed" if network else "the system refused a file operation"
        return f"{what}{where}: {reason.strip()} ({name})"
    return None


def library_outcome(error: BaseException, prepared: output_folder.PreparedOutput) -> bool:
    """For a Python call (`recordforge.convert`, `reshard`) whose run raised `error`, not a
    refusal of recordforge's own: True when this run's dataset is in place and only the cleanup
    after its commit failed (a warning is logged; the call succeeds, as the command does).

    Raises:
        RunFailed: a refused system call, or a full disk, in one line (the runner's exception
            as its cause), as the command reports it.
    """
    if _committed_by_this_run(prepared):
        LOGGER.warning("%s", _cleanup_failed(error, prepared))
        return True
    message = _out_of_space(error) or system_error(error)
    if message:
        raise RunFailed(f"{message}; {kept(prepared)}") from error
    return False
