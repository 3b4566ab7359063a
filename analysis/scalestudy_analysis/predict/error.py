"""The model's own measured error, and the intervals it widens.

Residuals: every measured N predicted by a fit that never saw it (leave one N out; and,
where the sweep spans several node counts, leave one node count out), and every scored
ledger entry. A residual is e = ln(predicted / measured) of the median step time, at an
extrapolation factor x = N / (the largest N fitted), or 1 where N lies inside the fit.

Extrapolation rule: the standard deviation of e grows as s·g(x), g(x) = 1 + log2(x).
Each doubling of N past the data adds ring steps, tree levels and a share of the step
that communication takes which no fit measured, and the error such a term makes is
systematic (a bandwidth or latency off by a factor stays off at every N), so it adds up
per doubling rather than averaging out: linear in log2(x), not in its square root. s is
the root mean square of e/g(x) over the residuals, pooled over the strategies of the
sweep (one model of the step, one error): about zero mean is assumed, so a biased model
counts its bias as error. The interval of a prediction at level L is
    step · exp(±√(b² + (t·s·g(x))²))
with b the bootstrap half-width (in log) over the repeats and t Student's quantile at
(1 + L)/2 with n degrees of freedom (n residuals; s is estimated about zero).
"""
import math
from dataclasses import dataclass, field

import numpy as np

# Past this many degrees of freedom Student's quantile is the normal one to 0.5 %.
NORMAL_DOF = 200


def growth(factor):
    """g(x) = 1 + log2(x), x ≥ 1: the error's growth with the extrapolation factor."""
    return 1.0 + math.log2(max(1.0, factor))


def _student_cdf(value, dof, steps=4000):
    """P(T ≤ value) for value ≥ 0: Simpson's rule on Student's density over [0, value]."""
    if value <= 0:
        return 0.5
    grid = np.linspace(0.0, value, steps + 1)
    log_norm = (math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2)
                - 0.5 * math.log(dof * math.pi))
    density = np.exp(log_norm - (dof + 1) / 2 * np.log1p(grid * grid / dof))
    weights = np.ones(steps + 1)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return 0.5 + float(weights @ density) * (value / steps) / 3.0


def student_quantile(probability, dof):
    """The quantile of Student's t at probability (> 0.5), by bisection on its CDF."""
    if dof >= NORMAL_DOF:
        from statistics import NormalDist
        return NormalDist().inv_cdf(probability)
    low, high = 0.0, 1.0
    while _student_cdf(high, dof) < probability:
        high *= 2.0
    for _ in range(50):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if _student_cdf(middle, dof) < probability else (low, middle)
    return 0.5 * (low + high)


@dataclass
class Residual:
    """One prediction of a measured step time by a fit that did not see it."""
    strategy: str
    source: str             # "leave one N out", "leave one node count out", "ledger"
    size: int
    fit_sizes: list
    predicted_s: float
    measured_s: float

    @property
    def factor(self):
        largest = max(self.fit_sizes) if self.fit_sizes else self.size
        return max(1.0, self.size / largest)

    @property
    def log_error(self):
        return math.log(self.predicted_s / self.measured_s)

    @property
    def signed_error(self):
        return self.predicted_s / self.measured_s - 1.0


def _scale(residuals):
    """s: the root mean square of e/g(x)."""
    terms = [(r.log_error / growth(r.factor)) ** 2 for r in residuals]
    return math.sqrt(sum(terms) / len(terms))


@dataclass
class ModelError:
    """The measured error of the model and the half-width it adds at level."""
    residuals: list
    level: float
    scale: float = math.nan
    quantile: float = math.nan
    covered: list = field(default_factory=list)   # per residual: inside its jackknife band

    def __post_init__(self):
        usable = [r for r in self.residuals if r.predicted_s > 0 and r.measured_s > 0]
        self.residuals = usable
        if usable:
            self.scale = _scale(usable)
            self.quantile = student_quantile((1.0 + self.level) / 2.0, len(usable))
        self.covered = [self._covered(index) for index in range(len(usable))]

    @property
    def known(self):
        return bool(self.residuals)

    def half_width(self, factor):
        """The model's share of the interval's half-width in log at extrapolation x."""
        return self.quantile * self.scale * growth(factor) if self.known else 0.0

    def _covered(self, index):
        """Whether residual index lies inside the band made from the other residuals
        (its own error cannot widen the band that judges it); None with one residual."""
        others = self.residuals[:index] + self.residuals[index + 1:]
        if not others:
            return None
        quantile = student_quantile((1.0 + self.level) / 2.0, len(others))
        residual = self.residuals[index]
        return abs(residual.log_error) <= quantile * _scale(others) * growth(residual.factor)

    def coverage(self):
        """(inside, judged): held-out points inside their band."""
        judged = [c for c in self.covered if c is not None]
        return sum(judged), len(judged)


def widen(value, low, high, model_half_width):
    """(low, high) of a positive prediction with the bootstrap's log half-widths and the
    model's combined in quadrature; each side keeps its own bootstrap width."""
    if not (value > 0 and math.isfinite(value)):
        return low, high
    below = math.log(value / low) if low > 0 else 0.0
    above = math.log(high / value) if high > 0 else 0.0
    return (value * math.exp(-math.hypot(max(below, 0.0), model_half_width)),
            value * math.exp(math.hypot(max(above, 0.0), model_half_width)))
