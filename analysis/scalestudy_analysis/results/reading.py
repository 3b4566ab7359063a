"""What every reader of result files shares: attribute values as h5py hands them back,
turned into plain Python values; the Problem a reader reports, so that nothing it finds
changes a number silently; and the reading of a family of per-step datasets of /steps
(the GPU state per step, or by phase), with the checks that turn a missing or malformed
dataset into one reported problem."""
from dataclasses import dataclass
from typing import Callable

import numpy as np


def text(value):
    """Scalars as Python values; bytes (fixed-length strings) decoded without padding."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace").rstrip("\x00")
    if isinstance(value, np.ndarray) and value.shape == ():
        return text(value[()])
    if isinstance(value, np.generic):
        return value.item()
    return value


def text_list(value):
    """A scalar or array attribute as a list of str, each item as text() turns it."""
    return [str(text(item)) for item in np.atleast_1d(value)]


def attributes(obj):
    """An h5py object's attributes as {name: plain Python value}."""
    return {key: text(value) for key, value in obj.attrs.items()}


@dataclass(frozen=True)
class Problem:
    """What a reader found wrong at `where`, and whether that data was left out of every
    number; line() gives it as the report's line."""
    where: str      # a file path or a series label
    kind: str       # short category, e.g. "failed", "incomplete", "mixed git_sha"
    message: str    # one line for the report
    excluded: bool  # True when the data behind `where` was left out of every number

    def line(self):
        effect = "excluded" if self.excluded else "kept"
        return f"**{self.kind}** ({effect}) `{self.where}`: {self.message}"


class MalformedStepDatasets(Exception):
    """A dataset of the family breaks the schema; the message names it."""


@dataclass
class StepDatasetFamily:
    """Datasets of /steps named prefix + field, read and checked as one family: how to read
    one, how to report a problem, and why a file without any still reads."""
    prefix: str                         # of every dataset's name, e.g. "gpu_"; the rest
                                        # of the name is the field it fills
    datasets: tuple                     # every dataset's name under /steps
    samples_dataset: str                # the sample counts, which must not be negative
    cells: str                          # what one count covers, e.g. "step-rank"
    read_dataset: Callable              # (steps, name, expected_shape) -> array, or raises
    problem: Callable                   # (path, message) -> Problem
    absent_note: str                    # why a file with none of them still reads

    @property
    def pattern(self):
        return f"/steps/{self.prefix}*"

    def field(self, name):
        return name[len(self.prefix):]


def read_step_datasets(handle, path, schema_version, family, expected_shape):
    """(values by field, problems): None and the one problem when the datasets are all
    missing (a problem that keeps the run), some missing, malformed or unreadable."""
    steps = handle["/steps"]
    missing = [name for name in family.datasets if name not in steps]
    if len(missing) == len(family.datasets):
        return None, [Problem(path, "missing field", f"no {family.pattern} in a schema version "
                              f"{schema_version} file; {family.absent_note}", False)]
    try:
        if missing:
            raise MalformedStepDatasets("missing " + ", ".join(f"/steps/{name}" for name in missing))
        values = {family.field(name): family.read_dataset(steps, name, expected_shape)
                  for name in family.datasets}
    except MalformedStepDatasets as error:
        return None, [family.problem(path, str(error))]
    except (OSError, KeyError, ValueError, TypeError) as error:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        return None, [family.problem(path, f"{family.pattern} unreadable ({first_line})")]
    samples_field = family.field(family.samples_dataset)
    negative = int((values[samples_field] < 0).sum())
    if negative:
        return None, [family.problem(path, f"/steps/{family.samples_dataset} is negative in "
                                           f"{negative} {family.cells} cells")]
    return values, []
