#!/usr/bin/env python3
"""Checks what the two-node sweep (experiments/two-nodes-cpu.ini) wrote: every point is
complete, every multi-rank run trains what the one-rank run trains, every rank's place is
recorded as Slurm gave it, the collectives crossed the link between the nodes, and the
report shows the nodes. With --bench-comm, also the `bench comm` file of 4 ranks on the
two nodes: busbw of the world, of each node's ranks and of one rank per node, by size, in
the file and in its report.

    check_two_node_results.py RESULTS_DIR HOST0 HOST1 --link-bytes BYTES [--bench-comm FILE]

BYTES: what the second node's link carried, both ways. Prints one line per failed check
and exits 1 if there is any.
"""
import argparse
import math
import sys
from pathlib import Path

import h5py
import numpy as np

# tests/mpi/test_strategies.cpp's tolerance for the parameters after 5 steps against the
# one-rank run: |got - ref| <= RTOL*|ref| + ATOL. The ranks sum gradients in another order
# than one rank does, so results differ in the last bits, some 1e-7 relative. Here the
# loss of every step is compared: a function of every parameter, it carries any
# difference in the step before, and a lost or doubled gradient moves it by far more.
RTOL = 1e-5
ATOL = 1e-6
RANKS_PER_NODE = 2  # the experiment's gpus_per_node


def text_list(dataset):
    return [value.decode() if isinstance(value, bytes) else str(value) for value in dataset[()]]


def read(path):
    with h5py.File(path, "r") as handle:
        ranks = handle["ranks"]
        return {"status": str(handle.attrs["status"]), "nodes": int(handle.attrs["nodes"]),
                "ranks_per_node": int(handle.attrs["ranks_per_node"]),
                "world_size": int(handle.attrs["world_size"]),
                "loss": handle["steps/loss"][()],
                "comm_bytes": int(handle["steps/comm_bytes"][()].sum()),
                "hostname": text_list(ranks["hostname"]),
                "node_index": ranks["node_index"][()].tolist(),
                "local_rank": ranks["local_rank"][()].tolist(),
                "cpu_binding": text_list(ranks["cpu_binding"]),
                "device": text_list(ranks["device"]),
                "device_uuid": text_list(ranks["device_uuid"]),
                "device_pci_bus_id": text_list(ranks["device_pci_bus_id"])}


def loss_mismatches(got, ref):
    """Steps whose loss differs from the one-rank run's beyond the tolerance."""
    if got.shape != ref.shape:
        return [f"{got.shape[0]} steps against {ref.shape[0]}"]
    return [f"step {step}: {g!r} against {r!r}" for step, (g, r) in enumerate(zip(got, ref))
            if not abs(g - r) <= RTOL * abs(r) + ATOL]


def placement_errors(run, hosts):
    """Ranks are placed in blocks of RANKS_PER_NODE, as sbatch's --ntasks-per-node and
    srun's default block distribution place them: rank r on node r // 2 as its local rank
    r % 2, each node a host of the cluster of its own."""
    n = run["world_size"]
    expected_nodes = math.ceil(n / RANKS_PER_NODE)
    errors = []
    if run["nodes"] != expected_nodes or run["ranks_per_node"] != min(n, RANKS_PER_NODE):
        errors.append(f"nodes × ranks per node is {run['nodes']}×{run['ranks_per_node']}, "
                      f"expected {expected_nodes}×{min(n, RANKS_PER_NODE)}")
    expected_index = [r // RANKS_PER_NODE for r in range(n)]
    expected_local = [r % RANKS_PER_NODE for r in range(n)]
    if run["node_index"] != expected_index:
        errors.append(f"node_index {run['node_index']}, expected {expected_index}")
    if run["local_rank"] != expected_local:
        errors.append(f"local_rank {run['local_rank']}, expected {expected_local}")
    host_of_node = {}
    for rank, host in enumerate(run["hostname"]):
        host_of_node.setdefault(rank // RANKS_PER_NODE, set()).add(host)
    if any(len(names) != 1 for names in host_of_node.values()) or \
            len(set(run["hostname"])) != expected_nodes or not set(run["hostname"]) <= set(hosts):
        errors.append(f"hostnames {run['hostname']}: expected one of {list(hosts)} per node, "
                      "a different one on each node")
    if any(not binding or not all(part.replace("-", "").isdigit() for part in binding.split(","))
           for binding in run["cpu_binding"]):
        errors.append(f"cpu_binding {run['cpu_binding']}: expected a CPU list per rank")
    if run["device"] != ["cpu"] * n or run["device_uuid"] != [""] * n or \
            run["device_pci_bus_id"] != [""] * n:
        errors.append(f"devices {run['device']}, {run['device_uuid']}, {run['device_pci_bus_id']}:"
                      " expected cpu without a GPU's UUID or bus id on every rank")
    return errors


def check_sweep(results, hosts):
    failures = []
    series = sorted(path for path in (results / "strong").iterdir() if path.is_dir())
    if len(series) != 4:
        failures.append(f"{len(series)} series in {results / 'strong'}, expected ddp and zero2 "
                        "with overlap off and on")
    for folder in series:
        runs = {n: read(folder / f"n{n}-r0.h5") for n in (1, 2, 4)}
        for n, run in runs.items():
            where = f"{folder.name} n{n}"
            if run["status"] != "complete":
                failures.append(f"{where}: status {run['status']}")
            failures += [f"{where}: {error}" for error in placement_errors(run, hosts)]
            if n > 1:
                failures += [f"{where}: loss {mismatch}"
                             for mismatch in loss_mismatches(run["loss"], runs[1]["loss"])]
        print(f"{folder.name}: loss at 1, 2 and 4 ranks agrees within rtol {RTOL} + atol {ATOL} "
              f"(largest difference {np.max(np.abs(runs[4]['loss'] - runs[1]['loss'])):.3g}); "
              f"4 ranks on {runs[4]['hostname']}, local ranks {runs[4]['local_rank']}")
    return failures


def check_link(results, link_bytes):
    """A collective of B payload bytes (docs/results-schema.md) over ranks on two nodes
    moves at least B bytes between them: each node's half of the output needs the other
    node's inputs. So the 4-rank runs' collectives alone set a floor under what the link
    carried; Slurm's own messages and the packets' headers only add to it."""
    floor = sum(read(path)["comm_bytes"] for path in sorted((results / "strong").glob("*/n4-r0.h5")))
    print(f"the link between the nodes carried {link_bytes} bytes; the 4-rank runs' collectives "
          f"need at least {floor}")
    return [] if floor > 0 and link_bytes >= floor else [
        f"the link carried {link_bytes} bytes, fewer than the {floor} the 4-rank runs' "
        "collectives need: their ranks did not talk over it"]


def check_report(results):
    report = results / "report" / "report.md"
    if not report.is_file():
        return [f"no report at {report}"]
    text = report.read_text(encoding="utf-8")
    return [] if "2 nodes" in text else [f"{report} does not say '2 nodes'"]


# The bench comm run: every rank, each node's ranks (both nodes at once), one rank per node.
EXPECTED_SCOPES = {"world": (4, 1), "intra_node": (RANKS_PER_NODE, 2), "inter_node": (2, 1)}


def bench_comm_errors(points, method):
    """points: the comm table as scalestudy_analysis.bench.report reads it; method: its group's
    attributes. Every scope is measured, over the ranks it should span, every point ok and
    exact, with a positive busbw at every size of every collective."""
    errors = []
    for scope, (ranks, groups) in EXPECTED_SCOPES.items():
        rows = points[points["scope"] == scope]
        if rows.empty:
            errors.append(f"bench comm: no {scope} points ({method.get('scope_' + scope, 'no scope_' + scope)})")
            continue
        if set(rows["ranks"]) != {ranks} or set(rows["groups"]) != {groups}:
            errors.append(f"bench comm: {scope} over {sorted(set(rows['ranks']))} rank(s) in "
                          f"{sorted(set(rows['groups']))} communicator(s), expected {ranks} in {groups}")
        bad = rows[(rows["status"] != "ok") | (rows["wrong_elems"] != 0) | ~(rows["busbw_gb_per_s"] > 0)]
        if not bad.empty:
            errors.append(f"bench comm: {scope}: {len(bad)} point(s) not ok, wrong or without busbw")
        if len(rows) != len(points[points["scope"] == "world"]):
            errors.append(f"bench comm: {scope} has {len(rows)} points, the world "
                          f"{len(points[points['scope'] == 'world'])}: not every size and collective")
    return errors


def check_bench_comm(path, out_dir):
    from scalestudy_analysis.bench import report as bench
    loaded = bench.read_bench_file(path)
    if not loaded.usable:
        return [f"bench comm {path}: " + "; ".join(p.line() for p in loaded.problems)]
    errors = bench_comm_errors(loaded.points, loaded.method)
    text, _ = bench.write_bench_report([path], out_dir)
    heading = "busbw (GB/s) by size: every rank, intra-node (the ranks of each node), inter-node (one rank per node)"
    if heading not in text:
        errors.append(f"bench comm: the report has no table '{heading}'")
    if not errors:
        world = loaded.points[loaded.points["scope"] == "world"]
        print(f"bench comm on 2 nodes × 2 ranks: world, intra-node and inter-node busbw at "
              f"{len(set(world['bytes']))} sizes of {len(set(world['collective']))} collectives")
    return errors


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("hosts", nargs=2)
    parser.add_argument("--link-bytes", type=int, required=True)
    parser.add_argument("--bench-comm", type=Path, help="the bench comm file of 4 ranks on the two nodes")
    args = parser.parse_args(argv[1:])
    failures = (check_sweep(args.results, args.hosts) + check_link(args.results, args.link_bytes)
                + check_report(args.results))
    if args.bench_comm:
        failures += check_bench_comm(args.bench_comm, args.results / "bench-report")
    for failure in failures:
        print(f"FAIL: {failure}")
    print(f"{'passed' if not failures else f'{len(failures)} check(s) failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
