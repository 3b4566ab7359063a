"""Bootstrap intervals for the ratios `compare` reports, resampling repeats and, inside
each, measured steps; the verdict at a stated level; and how many more repeats would
decide a point that the interval leaves undecided."""
import math
import zlib
from dataclasses import dataclass

import numpy as np

FASTER, SLOWER, SAME, UNDECIDED = "faster", "slower", "no difference", "undecided"
MORE_REPEATS_SHOWN = 100   # beyond this the estimate says only "more than 100"


def point_rng(seed, key):
    """A generator of its own for every point, from the seed and the point's name, so a
    point's interval does not change when other points are added or removed."""
    return np.random.default_rng([int(seed), zlib.crc32(repr(key).encode("utf-8"))])


def median_replicates(step_times_by_run, resamples, rng):
    """[resamples] bootstrap replicates of the pooled median step time. Each replicate
    draws as many runs as there are, with replacement, and inside each drawn run as many
    of its steps as it has, with replacement: the spread between repeats and between the
    steps of one run both enter the interval."""
    lengths = np.array([len(times) for times in step_times_by_run])
    width = int(lengths.max())
    padded = np.full((len(step_times_by_run), width), np.nan)
    for row, times in enumerate(step_times_by_run):
        padded[row, : len(times)] = times
    runs = rng.integers(0, len(step_times_by_run), size=(resamples, len(step_times_by_run)))
    positions = np.floor(rng.random((resamples, len(step_times_by_run), width))
                         * lengths[runs][:, :, None]).astype(np.int64)
    drawn = padded[runs[:, :, None], positions]
    drawn[np.arange(width)[None, None, :] >= lengths[runs][:, :, None]] = np.nan
    return np.nanmedian(drawn.reshape(resamples, -1), axis=1)


@dataclass
class Ratio:
    """A ratio of B to A with its bootstrap interval at `level`."""
    estimate: float
    low: float
    high: float
    level: float

    @classmethod
    def of(cls, estimate, replicates, level):
        replicates = np.asarray(replicates, dtype=np.float64)
        replicates = replicates[np.isfinite(replicates)]
        if not math.isfinite(estimate) or replicates.size == 0:
            return cls(math.nan, math.nan, math.nan, level)
        tail = (1.0 - level) / 2.0
        low, high = np.quantile(replicates, [tail, 1.0 - tail])
        return cls(float(estimate), float(low), float(high), level)

    def verdict(self, threshold, higher_is_faster=True):
        """faster or slower when the interval excludes 1 and leaves the band of ±threshold
        around it; no difference when it lies inside that band; undecided otherwise."""
        if not math.isfinite(self.estimate):
            return UNDECIDED
        band_low, band_high = 1.0 / (1.0 + threshold), 1.0 + threshold
        if band_low <= self.low and self.high <= band_high:
            return SAME
        if self.low > 1.0:
            return FASTER if higher_is_faster else SLOWER
        if self.high < 1.0:
            return SLOWER if higher_is_faster else FASTER
        return UNDECIDED

    def more_repeats(self, repeats, threshold):
        """More repeats (of each set) that would decide the point, assuming the interval's
        width on a log scale shrinks as 1/sqrt(repeats) and the estimate stays: the fewer
        of those that exclude 1 and those that fit the ±threshold band. 0 when already
        decided; None when no count would (an estimate right at the band's edge)."""
        if self.verdict(threshold) != UNDECIDED:
            return 0
        distance = abs(math.log(self.estimate))
        half_width = (math.log(self.high) - math.log(self.low)) / 2.0
        needed = []
        if distance > 0:
            needed.append(repeats * (half_width / distance) ** 2)
        margin = math.log(1.0 + threshold) - distance
        if margin > 0:
            needed.append(repeats * (half_width / margin) ** 2)
        if not needed:
            return None
        return max(1, math.ceil(min(needed)) - repeats)

    def cell(self, digits=4):
        if not math.isfinite(self.estimate):
            return "—"
        return f"{self.estimate:.{digits}f} [{self.low:.{digits}f}–{self.high:.{digits}f}]"
