"""The two-node sweep's checks fail where they should: a loss off by more than the
equivalence tests' tolerance, and every way a rank's place can be recorded wrong."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_two_node_results as check  # noqa: E402

HOSTS = ("ss-node0", "ss-node1")


def four_ranks(**changes):
    run = {"world_size": 4, "nodes": 2, "ranks_per_node": 2,
           "hostname": ["ss-node0", "ss-node0", "ss-node1", "ss-node1"],
           "node_index": [0, 0, 1, 1], "local_rank": [0, 1, 0, 1],
           "cpu_binding": ["0-1", "0-1", "0", "1"], "device": ["cpu"] * 4,
           "device_uuid": [""] * 4, "device_pci_bus_id": [""] * 4}
    run.update(changes)
    return run


def test_a_correct_run_passes_on_either_node_at_one_and_two_ranks():
    assert check.placement_errors(four_ranks(), HOSTS) == []
    one = {**four_ranks(), "world_size": 1, "nodes": 1, "ranks_per_node": 1, "hostname": ["ss-node1"],
           "node_index": [0], "local_rank": [0], "cpu_binding": ["0-1"], "device": ["cpu"],
           "device_uuid": [""], "device_pci_bus_id": [""]}
    assert check.placement_errors(one, HOSTS) == []


@pytest.mark.parametrize("changes, fragment", [
    (dict(nodes=1, ranks_per_node=4), "nodes × ranks per node is 1×4"),
    (dict(node_index=[0, 0, 0, 0]), "node_index"),
    (dict(local_rank=[0, 1, 2, 3]), "local_rank"),
    (dict(hostname=["ss-node0"] * 4), "hostnames"),
    (dict(hostname=["ss-node0", "ss-node1", "ss-node0", "ss-node1"]), "hostnames"),
    (dict(hostname=["vm", "vm", "ss-node1", "ss-node1"]), "hostnames"),
    (dict(cpu_binding=["0-1", "", "0", "1"]), "cpu_binding"),
    (dict(device_uuid=["GPU-1", "", "", ""]), "devices"),
])
def test_each_misrecorded_place_is_named(changes, fragment):
    errors = check.placement_errors(four_ranks(**changes), HOSTS)
    assert len(errors) == 1 and fragment in errors[0], errors


def comm_points(**changes):
    """A bench comm table of 2 nodes × 2 ranks: one size of allreduce in every scope."""
    import pandas as pd
    points = pd.DataFrame({"scope": ["world", "intra_node", "inter_node"], "ranks": [4, 2, 2],
                           "groups": [1, 2, 1], "collective": ["allreduce"] * 3, "bytes": [1024] * 3,
                           "status": ["ok"] * 3, "wrong_elems": [0] * 3, "busbw_gb_per_s": [1.0, 2.0, 0.5]})
    for column, values in changes.items():
        points[column] = values
    return points


def test_bench_comm_with_every_scope_passes_and_each_gap_is_named():
    assert check.bench_comm_errors(comm_points(), {}) == []
    absent = comm_points().iloc[:2]
    (error,) = check.bench_comm_errors(absent, {"scope_inter_node": "absent: one node"})
    assert "no inter_node points (absent: one node)" in error
    (error,) = check.bench_comm_errors(comm_points(ranks=[4, 4, 2], groups=[1, 1, 1]), {})
    assert "intra_node over [4] rank(s) in [1] communicator(s), expected 2 in 2" in error
    (error,) = check.bench_comm_errors(comm_points(wrong_elems=[0, 0, 3]), {})
    assert "inter_node: 1 point(s)" in error
    (error,) = check.bench_comm_errors(comm_points(busbw_gb_per_s=[1.0, float("nan"), 0.5]), {})
    assert "intra_node: 1 point(s)" in error


def test_losses_within_the_tolerance_pass_and_one_step_beyond_it_fails():
    reference = np.array([4.17, 4.09, 4.04])
    assert check.loss_mismatches(reference * (1 + 1e-9), reference) == []
    beyond = reference.copy()
    beyond[2] += 2 * (check.RTOL * reference[2] + check.ATOL)
    assert [m.split(":")[0] for m in check.loss_mismatches(beyond, reference)] == ["step 2"]
    assert check.loss_mismatches(reference[:2], reference) == ["2 steps against 3"]
    assert check.loss_mismatches(np.array([4.17, np.nan, 4.04]), reference)[0].startswith("step 1")
