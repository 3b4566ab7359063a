"""Interval algebra and exposed communication on hand-made intervals."""
import math

import numpy as np
import pytest

from scalestudy_analysis.results.intervals import step_quantities, union_length, uncovered_length
from synth import PHASES


def one_step(step_length, phases, ranks=1):
    """[1, R, P, 2] intervals with the given phases ({name: (begin, end)}) on every rank."""
    intervals = np.full((1, ranks, len(PHASES), 2), np.nan)
    intervals[0, :, PHASES.index("step")] = (0.0, step_length)
    for name, span in phases.items():
        intervals[0, :, PHASES.index(name)] = span
    return intervals


def comm_rows(spans, rank=0, row=0):
    spans = list(spans)
    n = len(spans)
    return dict(coll_row=np.full(n, row), coll_rank=np.full(n, rank),
                coll_begin=np.array([b for b, _ in spans], float),
                coll_end=np.array([e for _, e in spans], float),
                coll_kind=np.zeros(n, int), coll_phase=np.full(n, PHASES.index("grad-comm")))


def test_union_merges_overlapping_and_separates_groups():
    lengths = union_length([0, 0, 0, 1, 1], [0.0, 0.5, 3.0, 0.0, math.nan],
                           [1.0, 2.0, 4.0, 0.25, 1.0], n_groups=3)
    assert lengths.tolist() == [3.0, 0.25, 0.0]


def test_uncovered_length_partial():
    exposed = uncovered_length([0], [0.4], [0.8], [0, 0], [0.0, 0.7], [0.5, 1.0], n_groups=1)
    assert exposed[0] == pytest.approx(0.2, abs=1e-15)


COMPUTE = {"data": (0.0, 0.1), "forward": (0.1, 0.4), "backward": (0.4, 0.8),
           "optimizer": (0.9, 1.0)}


def test_comm_fully_hidden_behind_compute_is_not_exposed():
    q = step_quantities(one_step(1.0, COMPUTE), **comm_rows([(0.45, 0.6), (0.6, 0.75)]))
    assert q.comm_time[0] == pytest.approx(0.3, abs=1e-15)
    assert q.exposed_comm[0] == 0.0


def test_comm_with_no_overlap_is_all_exposed():
    q = step_quantities(one_step(1.0, COMPUTE), **comm_rows([(0.8, 0.9)]))
    assert q.comm_time[0] == pytest.approx(0.1, abs=1e-15)
    assert q.exposed_comm[0] == pytest.approx(0.1, abs=1e-15)


def test_partial_overlap_is_exact():
    # 0.7-0.8 under backward, 0.8-0.9 exposed, 0.9-0.95 under optimizer; a second
    # collective overlapping the first counts once.
    q = step_quantities(one_step(1.0, COMPUTE), **comm_rows([(0.7, 0.95), (0.75, 0.85)]))
    assert q.comm_time[0] == pytest.approx(0.25, abs=1e-15)
    assert q.exposed_comm[0] == pytest.approx(0.1, abs=1e-15)


def test_data_phase_does_not_hide_comm():
    q = step_quantities(one_step(1.0, COMPUTE), **comm_rows([(0.0, 0.1)]))
    assert q.exposed_comm[0] == pytest.approx(0.1, abs=1e-15)


def test_no_collectives_means_zero_comm():
    q = step_quantities(one_step(1.0, COMPUTE), **comm_rows([]))
    assert q.comm_time[0] == 0.0 and q.exposed_comm[0] == 0.0


def test_max_over_ranks_and_breakdown_on_the_slowest_rank():
    intervals = one_step(1.0, COMPUTE, ranks=2)
    intervals[0, 1, PHASES.index("step"), 1] = 1.2
    rows = comm_rows([(0.8, 0.9)], rank=0)
    other = comm_rows([(0.5, 0.6), (0.8, 1.1)], rank=1)
    merged = {key: np.concatenate([rows[key], other[key]]) for key in rows}
    q = step_quantities(intervals, **merged)
    assert q.step_time[0] == 1.2 and q.critical_rank[0] == 1
    assert q.comm_per_rank[0].tolist() == pytest.approx([0.1, 0.4], abs=1e-15)
    assert q.exposed_per_rank[0].tolist() == pytest.approx([0.1, 0.2], abs=1e-15)
    assert q.comm_time[0] == pytest.approx(0.4) and q.exposed_comm[0] == pytest.approx(0.2)
    assert q.compute[0] == pytest.approx(0.7)
    assert q.optimizer[0] == pytest.approx(0.1)
    assert q.exposed_on_critical[0] == pytest.approx(0.2)
    # data 0.0–0.1; other: nothing ran 1.1–1.2.
    assert q.data[0] == pytest.approx(0.1) and q.other[0] == pytest.approx(0.1)
    assert q.compute[0] + q.optimizer[0] + q.exposed_on_critical[0] + q.data[0] + q.other[0] == \
        pytest.approx(1.2, abs=1e-15)


def test_collective_spilling_into_next_step_is_carried_over():
    intervals = np.concatenate([one_step(1.0, COMPUTE), one_step(1.0, COMPUTE)])
    q = step_quantities(intervals, **comm_rows([(0.95, 1.3)], row=0))
    assert q.comm_time.tolist() == pytest.approx([0.05, 0.3], abs=1e-15)
    # In step 1 the carried part 0.0-0.3 lies under data (0-0.1) and forward (0.1-0.3).
    assert q.exposed_comm.tolist() == pytest.approx([0.0, 0.1], abs=1e-15)
    assert q.pieces.carried.tolist() == [False, True]


def test_comm_during_a_wait_inside_compute_is_exposed():
    # Backward spans 0.4–0.8 but was blocked 0.5–0.6 waiting for a collective that ran
    # 0.45–0.65: the 0.1 s of the wait is exposed although it lies inside backward.
    rows = comm_rows([(0.45, 0.65)])
    rows.update(coll_wait_begin=np.array([0.5]), coll_wait_end=np.array([0.6]))
    quantities = step_quantities(one_step(1.0, COMPUTE), **rows)
    assert quantities.comm_time[0] == pytest.approx(0.2, abs=1e-12)
    assert quantities.exposed_comm[0] == pytest.approx(0.1, abs=1e-12)


def test_a_wait_outside_compute_is_not_counted_twice():
    # A wait after backward (0.8–0.9) for a collective running 0.7–0.9: the part outside
    # compute (0.8–0.9) is exposed once; 0.7–0.8 is hidden by backward.
    rows = comm_rows([(0.7, 0.9)])
    rows.update(coll_wait_begin=np.array([0.8]), coll_wait_end=np.array([0.9]))
    phases = {"data": (0.0, 0.1), "forward": (0.1, 0.4), "backward": (0.4, 0.8),
              "optimizer": (0.9, 0.95)}
    quantities = step_quantities(one_step(1.0, phases), **rows)
    assert quantities.exposed_comm[0] == pytest.approx(0.1, abs=1e-12)


def test_each_ranks_own_compute_leaves_out_its_waits():
    # Rank 0 computes 0.1–0.8 but sat 0.5–0.6 waiting for a collective (rank 1's part of
    # it); rank 1 computes 0.1–0.9 without waiting. Their own compute: 0.6 and 0.8.
    phases = {"data": (0.0, 0.1), "forward": (0.1, 0.4), "backward": (0.4, 0.8),
              "optimizer": (0.9, 1.0)}
    intervals = one_step(1.0, phases, ranks=2)
    intervals[0, 1, PHASES.index("backward")] = (0.4, 0.9)
    rows = comm_rows([(0.45, 0.65)], rank=0)
    rows.update(coll_wait_begin=np.array([0.5]), coll_wait_end=np.array([0.6]))
    quantities = step_quantities(intervals, **rows)
    assert quantities.compute_busy_per_rank[0].tolist() == pytest.approx([0.6, 0.8], abs=1e-12)


def test_the_breakdown_parts_are_disjoint_and_add_up_to_the_step():
    # Backward 0.4–0.8 sat blocked 0.5–0.6 on a collective running 0.45–0.65; a second
    # wait 0.8–0.85 had no collective running (its peer was late); nothing runs 0.85–0.9.
    # compute: 0.1–0.5 and 0.6–0.8 = 0.6; optimizer 0.9–1.0 = 0.1; exposed: the wait's
    # 0.5–0.6 = 0.1; data 0.0–0.1 = 0.1; other: 0.8–0.9 = 0.1.
    rows = comm_rows([(0.45, 0.65), (0.3, 0.3)])
    rows.update(coll_wait_begin=np.array([0.5, 0.8]), coll_wait_end=np.array([0.6, 0.85]))
    q = step_quantities(one_step(1.0, COMPUTE), **rows)
    parts = (q.compute[0], q.optimizer[0], q.exposed_on_critical[0], q.data[0], q.other[0])
    assert parts == pytest.approx((0.6, 0.1, 0.1, 0.1, 0.1), abs=1e-12)
    assert sum(parts) == pytest.approx(q.step_time[0], abs=1e-12)
    assert q.exposed_on_critical[0] == pytest.approx(q.exposed_per_rank[0, 0], abs=1e-12)


def test_communication_during_the_data_phase_is_exposed_not_data():
    # The collective 0.05–0.15 runs over data (0–0.1) and forward (0.1–0.4): 0.05 of it
    # is exposed, and data keeps only 0.0–0.05.
    q = step_quantities(one_step(1.0, COMPUTE), **comm_rows([(0.05, 0.15)]))
    assert q.exposed_on_critical[0] == pytest.approx(0.05, abs=1e-12)
    assert q.data[0] == pytest.approx(0.05, abs=1e-12)
    assert q.compute[0] == pytest.approx(0.7, abs=1e-12)
    total = q.compute[0] + q.optimizer[0] + q.exposed_on_critical[0] + q.data[0] + q.other[0]
    assert total == pytest.approx(1.0, abs=1e-12)
