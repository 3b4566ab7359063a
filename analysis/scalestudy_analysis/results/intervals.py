"""Interval algebra on phase and collective intervals, and the per-step quantities built
from it (step time, communication time, exposed communication, breakdown).

Everything works on many (step, rank) groups at once: a group id is `row * R + rank`,
where `row` indexes /steps. All definitions follow docs/results-schema.md, /summary.
"""
from dataclasses import dataclass

import numpy as np
import pandas as pd

from scalestudy_analysis.results.schema import COVERING_PHASES, PHASE


def _valid(group, begin, end):
    group = np.asarray(group, dtype=np.int64)
    begin = np.asarray(begin, dtype=np.float64)
    end = np.asarray(end, dtype=np.float64)
    keep = np.isfinite(begin) & np.isfinite(end) & (end > begin)
    return group[keep], begin[keep], end[keep]


def merge_segments(group, begin, end):
    """Disjoint, sorted segments covering the same set per group as the input intervals."""
    group, begin, end = _valid(group, begin, end)
    if group.size == 0:
        return group, begin, end
    frame = pd.DataFrame({"g": group, "b": begin, "e": end})
    frame = frame.sort_values(["g", "b"], kind="mergesort").reset_index(drop=True)
    reach = frame.groupby("g", sort=False)["e"].cummax()
    previous_reach = reach.groupby(frame["g"], sort=False).shift()
    # Touching intervals merge; the covered length is the same either way.
    starts = previous_reach.isna().to_numpy() | (frame["b"].to_numpy() > previous_reach.to_numpy())
    segment = np.cumsum(starts) - 1
    merged = frame.groupby(segment, sort=True).agg(g=("g", "first"), b=("b", "min"), e=("e", "max"))
    return merged["g"].to_numpy(), merged["b"].to_numpy(), merged["e"].to_numpy()


def union_length(group, begin, end, n_groups):
    """Length of the union of the intervals of each group; 0 for groups without any."""
    group, begin, end = merge_segments(group, begin, end)
    return np.bincount(group, weights=end - begin, minlength=n_groups)[:n_groups]


def uncovered_length(group, begin, end, cover_group, cover_begin, cover_end, n_groups):
    """Length of the union of the intervals not covered by the union of the cover, per
    group: |A ∪ B| - |B| equals |A \\ B| and needs no pairwise intersection."""
    both = union_length(np.concatenate([group, cover_group]),
                        np.concatenate([begin, cover_begin]),
                        np.concatenate([end, cover_end]), n_groups)
    cover = union_length(cover_group, cover_begin, cover_end, n_groups)
    return np.maximum(both - cover, 0.0)


def triple_intersection_length(a, b, c, n_groups):
    """|A ∩ B ∩ C| per group, by inclusion–exclusion over unions."""
    return (union_length(*a, n_groups) + union_length(*b, n_groups) + union_length(*c, n_groups)
            - union_length(*_join(a, b), n_groups) - union_length(*_join(a, c), n_groups)
            - union_length(*_join(b, c), n_groups) + union_length(*_join(_join(a, b), c), n_groups))


def _join(first, second):
    return tuple(np.concatenate([x, y]) for x, y in zip(first, second))


def clip_to_window(group, begin, end, window_begin, window_end):
    """Clips each interval to its group's window; drops what falls outside."""
    group, begin, end = _valid(group, begin, end)
    begin = np.maximum(begin, window_begin[group])
    end = np.minimum(end, window_end[group])
    keep = end > begin
    return group[keep], begin[keep], end[keep]


@dataclass
class CommPieces:
    """Collective intervals cut at step boundaries: each piece lies inside the window of
    the step (row) it is attributed to, in that step's time frame."""
    row: np.ndarray
    rank: np.ndarray
    begin: np.ndarray
    end: np.ndarray
    kind: np.ndarray
    phase: np.ndarray
    carried: np.ndarray  # True for the part of a collective started in an earlier step


def split_collectives(row, rank, begin, end, kind, phase, step_begin, step_end):
    """Cuts collectives at the end of their step and moves the overflow into the next
    step's frame. Steps are contiguous on a rank, so time t in step s is
    t - end(s) + begin(s+1) in step s+1 (docs/results-schema.md, /steps)."""
    n_rows, _ = step_end.shape
    row = np.asarray(row, dtype=np.int64)
    rank = np.asarray(rank, dtype=np.int64)
    begin = np.asarray(begin, dtype=np.float64)
    end = np.asarray(end, dtype=np.float64)
    kind = np.asarray(kind, dtype=np.int64)
    phase = np.asarray(phase, dtype=np.int64)
    carried = np.zeros(row.shape, dtype=bool)
    pieces = []
    while row.size:
        window_begin = step_begin[row, rank]
        window_end = step_end[row, rank]
        piece_begin = np.maximum(begin, window_begin)
        piece_end = np.minimum(end, window_end)
        inside = piece_end > piece_begin
        pieces.append((row[inside], rank[inside], piece_begin[inside], piece_end[inside],
                       kind[inside], phase[inside], carried[inside]))
        spill = (end > window_end) & (row + 1 < n_rows)
        if not spill.any():
            break
        shift = window_end[spill] - step_begin[row[spill] + 1, rank[spill]]
        row, rank, kind, phase = row[spill] + 1, rank[spill], kind[spill], phase[spill]
        begin = np.maximum(begin[spill], window_end[spill]) - shift
        end = end[spill] - shift
        carried = np.ones(row.shape, dtype=bool)
    if not pieces:
        empty_i, empty_f = np.zeros(0, np.int64), np.zeros(0, np.float64)
        return CommPieces(empty_i, empty_i, empty_f, empty_f, empty_i, empty_i,
                          np.zeros(0, bool))
    columns = [np.concatenate(parts) for parts in zip(*pieces)]
    return CommPieces(*columns)


def elementary_segments(sets, n_groups):
    """Cuts the time of every group at every begin and end of the given interval sets.
    sets: a list of (group, begin, end) arrays. Returns (group, length, covered) with
    covered[k] the boolean array "segment lies in set k"; segments of zero length are
    left out. Each segment lies wholly inside or wholly outside each set, so any Boolean
    combination of the sets has the summed length of the segments it selects."""
    groups, times, deltas = [], [], []
    for index, (group, begin, end) in enumerate(sets):
        group, begin, end = _valid(group, begin, end)
        column = np.zeros((2 * group.size, len(sets)), dtype=np.int64)
        column[: group.size, index] = 1
        column[group.size:, index] = -1
        groups.append(np.concatenate([group, group]))
        times.append(np.concatenate([begin, end]))
        deltas.append(column)
    group = np.concatenate(groups) if groups else np.zeros(0, np.int64)
    time = np.concatenate(times) if times else np.zeros(0)
    delta = np.concatenate(deltas) if deltas else np.zeros((0, len(sets)), np.int64)
    order = np.lexsort((time, group))
    group, time, delta = group[order], time[order], delta[order]
    # Every interval adds 1 and takes 1 away inside its own group, so a running sum over
    # all events is each group's coverage count, back at 0 where a new group starts.
    coverage = np.cumsum(delta, axis=0)[:-1] > 0
    length = np.diff(time)
    same_group = group[1:] == group[:-1]
    keep = same_group & (length > 0)
    return group[:-1][keep], length[keep], [coverage[keep, k] for k in range(len(sets))]


BREAKDOWN_PARTS = ("compute", "optimizer", "exposed_comm", "data", "other")


def critical_path_parts(window, forward_backward, optimizer, comm, waits, data, n_groups):
    """Splits each group's step window into disjoint parts whose lengths add up to it:
    compute, forward ∪ backward while not blocked on a collective; optimizer, the
    optimizer's interval outside those and not blocked; exposed_comm, communication not
    hidden by either (the schema's exposed communication); data, the data phase outside
    all of them; other, the rest (waits with no collective running, host gaps). Every
    set must already be clipped to its group's window. Returns {part: [n_groups]}."""
    group, length, (inside, fb, opt, busy, wait, loading) = elementary_segments(
        [window, forward_backward, optimizer, comm, waits, data], n_groups)
    computing = fb & ~wait
    hiding = (fb | opt) & ~wait
    parts = {"compute": computing,
             "optimizer": opt & ~fb & ~wait,
             "exposed_comm": busy & ~hiding,
             "data": loading & ~busy & ~hiding}
    parts["other"] = inside & ~(hiding | busy | loading)
    return {name: np.bincount(group[mask], weights=length[mask], minlength=n_groups)[:n_groups]
            for name, mask in parts.items()}


@dataclass
class StepQuantities:
    """Per-step values (arrays over /steps rows) and the per-rank arrays behind them. The
    breakdown (compute, optimizer, exposed_on_critical, data, other) is the critical
    rank's step cut into disjoint parts: per step they add up to step_time."""
    step_time: np.ndarray      # [S] max over ranks of the step length
    critical_rank: np.ndarray  # [S] the rank that sets step_time
    comm_time: np.ndarray      # [S] max over ranks of the comm union
    exposed_comm: np.ndarray   # [S] max over ranks of comm not covered by compute
    compute: np.ndarray        # [S] critical rank: forward ∪ backward, less its waits
    optimizer: np.ndarray      # [S] critical rank: optimizer outside compute, less its waits
    exposed_on_critical: np.ndarray  # [S] exposed comm of the critical rank
    data: np.ndarray           # [S] critical rank: the data phase outside all of the above
    other: np.ndarray          # [S] critical rank: the rest of the step
    comm_per_rank: np.ndarray      # [S, R]
    exposed_per_rank: np.ndarray   # [S, R]
    pieces: CommPieces
    # [S, R] |forward ∪ backward| less the time blocked in it waiting for collectives:
    # what each rank's own compute took, whatever the other ranks did.
    compute_busy_per_rank: np.ndarray = None


def _phase_intervals(intervals, names):
    """Phase intervals of every group as flat (group, begin, end) arrays."""
    n_rows, n_ranks = intervals.shape[:2]
    groups = np.arange(n_rows * n_ranks)
    parts = [(groups, intervals[:, :, PHASE[name], 0].ravel(),
              intervals[:, :, PHASE[name], 1].ravel()) for name in names]
    return tuple(np.concatenate(column) for column in zip(*parts))


def step_quantities(intervals, coll_row, coll_rank, coll_begin, coll_end, coll_kind,
                    coll_phase, coll_wait_begin=None, coll_wait_end=None):
    """Derives the per-step quantities of docs/results-schema.md from /steps/intervals
    ([S, R, P, 2]) and /collectives (rows already mapped from step_index to /steps row).
    Compute does not hide communication while it is blocked waiting for a collective
    (the wait intervals), so exposed = |A| - |A ∩ C| + |A ∩ C ∩ W| with A the comm
    stream's busy time, C the compute phases and W the waits."""
    intervals = np.asarray(intervals, dtype=np.float64)
    n_rows, n_ranks = intervals.shape[:2]
    n_groups = n_rows * n_ranks
    step_begin = intervals[:, :, PHASE["step"], 0]
    step_end = intervals[:, :, PHASE["step"], 1]
    step_length = step_end - step_begin
    window_begin, window_end = step_begin.ravel(), step_end.ravel()
    clip = lambda sets: clip_to_window(*sets, window_begin, window_end)  # noqa: E731

    pieces = split_collectives(coll_row, coll_rank, coll_begin, coll_end, coll_kind,
                               coll_phase, step_begin, step_end)
    comm = (pieces.row * n_ranks + pieces.rank, pieces.begin, pieces.end)
    forward_backward = clip(_phase_intervals(intervals, ("forward", "backward")))
    covering = clip(_phase_intervals(intervals, COVERING_PHASES))

    if coll_wait_begin is None:
        coll_wait_begin = np.full(np.shape(coll_row), np.nan)
        coll_wait_end = np.full(np.shape(coll_row), np.nan)
    waits = clip((np.asarray(coll_row, dtype=np.int64) * n_ranks
                  + np.asarray(coll_rank, dtype=np.int64), coll_wait_begin, coll_wait_end))

    comm_len = union_length(*comm, n_groups)
    exposed_len = (uncovered_length(*comm, *covering, n_groups)
                   + triple_intersection_length(comm, covering, waits, n_groups))
    parts = critical_path_parts(
        (np.arange(n_groups), window_begin, window_end), forward_backward,
        clip(_phase_intervals(intervals, ("optimizer",))), comm, waits,
        clip(_phase_intervals(intervals, ("data",))), n_groups)
    parts = {name: values.reshape(n_rows, n_ranks) for name, values in parts.items()}
    comm_len = comm_len.reshape(n_rows, n_ranks)
    exposed_len = exposed_len.reshape(n_rows, n_ranks)

    if n_rows == 0:
        critical = np.zeros(0, dtype=np.int64)
    else:
        # A NaN step length (missing step phase) must not be picked as the maximum.
        critical = np.argmax(np.where(np.isnan(step_length), -np.inf, step_length), axis=1)
    rows = np.arange(n_rows)
    step_time = step_length[rows, critical]
    step_time = np.where(np.isnan(step_length).any(axis=1), np.nan, step_time)
    on_critical = {name: values[rows, critical] for name, values in parts.items()}
    return StepQuantities(
        step_time=step_time,
        critical_rank=critical,
        comm_time=comm_len.max(axis=1) if n_ranks else np.zeros(n_rows),
        exposed_comm=exposed_len.max(axis=1) if n_ranks else np.zeros(n_rows),
        compute=on_critical["compute"],
        optimizer=on_critical["optimizer"],
        exposed_on_critical=on_critical["exposed_comm"],
        data=on_critical["data"],
        other=on_critical["other"],
        comm_per_rank=comm_len,
        exposed_per_rank=exposed_len,
        pieces=pieces,
        compute_busy_per_rank=parts["compute"],
    )
