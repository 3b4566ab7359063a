"""What the report shows of each series beyond its scaling table and breakdown: memory per
rank by kind, loss against step beside the 1-rank run, and the collectives' achieved
bandwidth. The numbers are kept for the warnings and the exports."""
from dataclasses import dataclass, field

import pandas as pd

from .bandwidth import bandwidth_figure, bandwidth_markdown, bandwidth_table
from .loss import departure_line, loss_figure
from .markdown import figure_markdown
from .memory import memory_markdown, memory_table


@dataclass
class SeriesDetails:
    memory: pd.DataFrame
    bandwidth: pd.DataFrame
    loss_departure: dict                 # N -> largest relative departure from 1 rank
    figures: list = field(default_factory=list)

    def markdown(self, series):
        sources = sorted({run.peak_bytes_source for run in series.runs if run.peak_bytes_source})
        loss, bandwidth = self.figures
        parts = ["#### Memory per rank", "", memory_markdown(self.memory, ", ".join(sources)), "",
                 "#### Loss", "", figure_markdown(loss), ""]
        line = departure_line(series, self.loss_departure)
        if line:
            parts += [line, ""]
        parts += ["#### Collectives' bandwidth", "", bandwidth_markdown(self.bandwidth), "",
                  figure_markdown(bandwidth), ""]
        return "\n".join(parts)


def series_details(series, series_list, out_dir, benches):
    loss, departures = loss_figure(series, series_list, out_dir)
    bandwidth = bandwidth_table(series, benches)
    return SeriesDetails(memory=memory_table(series), bandwidth=bandwidth,
                         loss_departure=departures,
                         figures=[loss, bandwidth_figure(series, bandwidth, out_dir)])
