"""Problems found while loading and grouping results. Each one is named in the report;
none is allowed to change a number silently."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    where: str      # a file path or a series label
    kind: str       # short category, e.g. "failed", "incomplete", "mixed git_sha"
    message: str    # one line for the report
    excluded: bool  # True when the data behind `where` was left out of every number

    def line(self):
        effect = "excluded" if self.excluded else "kept"
        return f"**{self.kind}** ({effect}) `{self.where}`: {self.message}"
