"""Where each rank ran: its node and local rank, the GPU it drove and the transports NCCL
connected it through (/ranks, versions 5, 7 and 8). From version 7 the nodes are MPI's (its shared-memory domains, which also pick
each rank's GPU) and the file's nodes × ranks per node count them. Where MPI's nodes and
the hostnames disagree, or two ranks of one run drove one GPU, the run is named under
Problems: its topology, or its devices, are not what its hostnames suggest."""
from collections import defaultdict

import numpy as np

from scalestudy_analysis.results.reading import Problem, text_list
from scalestudy_analysis.results.schema import (DEVICE_ID_DATASETS, DEVICE_ID_VERSION, LINK_EMULATION_ATTRIBUTE, LINK_VERSION,
                     MPI_PLACEMENT_VERSION, PLACEMENT_DATASETS, PLACEMENT_VERSION, TRANSPORTS_ATTRIBUTE,
                     TRANSPORTS_RANKS_ATTRIBUTE)

# What a device id reads as when the rank could not query its GPU (src/backend/cuda/).
UNAVAILABLE_PREFIX = "unavailable"


def _read_family(handle, run, names, since, as_text):
    """{name: per-rank values} of the /ranks datasets present with one value per rank,
    and the problem naming the rest in a file of a version that writes them."""
    found, missing = {}, []
    for name in names:
        path = f"/ranks/{name}"
        if path not in handle:
            missing.append(path)
            continue
        values = handle[path][()]
        if np.shape(values) != (run.world_size,):
            missing.append(f"{path} (shape {np.shape(values)}, expected [{run.world_size}])")
            continue
        found[name] = text_list(values) if as_text else np.asarray(values, dtype=np.int64)
    problems = []
    if missing and run.schema_version >= since:
        problems.append(Problem(run.path, "missing field", ", ".join(missing) + " in a schema "
                                f"version {run.schema_version} file; read as unknown", False))
    return found, problems


def read_placement(handle, run):
    """Sets run.node_index and run.local_rank (version 5 on), run.device_uuid and
    run.device_pci_bus_id (version 7 on) and run.rank_transports (version 8) where the
    file holds them, None otherwise.
    Returns the problems found in them."""
    placement, problems = _read_family(handle, run, PLACEMENT_DATASETS, PLACEMENT_VERSION, False)
    devices, device_problems = _read_family(handle, run, DEVICE_ID_DATASETS, DEVICE_ID_VERSION, True)
    run.node_index = placement.get("node_index")
    run.local_rank = placement.get("local_rank")
    run.device_uuid = devices.get("device_uuid")
    run.device_pci_bus_id = devices.get("device_pci_bus_id")
    run.rank_transports, link_problems = _rank_transports(handle, run)
    absent = [name for name in (LINK_EMULATION_ATTRIBUTE, TRANSPORTS_ATTRIBUTE) if name not in run.attrs]
    if absent and run.schema_version >= LINK_VERSION:
        link_problems.append(Problem(run.path, "missing field", "root attribute " + ", ".join(absent) +
                                     f" in a schema version {run.schema_version} file; read as no "
                                     "emulation and transports unknown", False))
    return (problems + device_problems + link_problems + _disagreement(run) + _shared_devices(run))


def _rank_transports(handle, run):
    """/ranks' attribute nccl_transports, one list per rank (version 8), or None with the
    problem that names its absence or wrong length in a file of a version that writes it."""
    values = handle["/ranks"].attrs.get(TRANSPORTS_RANKS_ATTRIBUTE) if "/ranks" in handle else None
    if values is not None and np.shape(values) == (run.world_size,):
        return text_list(values), []
    if run.schema_version < LINK_VERSION:
        return None, []
    found = "missing" if values is None else f"of shape {np.shape(values)}, expected [{run.world_size}]"
    return None, [Problem(run.path, "missing field", f"/ranks attribute {TRANSPORTS_RANKS_ATTRIBUTE} {found} "
                          f"in a schema version {run.schema_version} file; read as unknown", False)]


def _disagreement(run):
    """MPI's nodes against the hostnames (version 7; before it the nodes were numbered
    from the hostnames, so they cannot disagree): one node per host, one host per node."""
    if run.schema_version < MPI_PLACEMENT_VERSION or run.node_index is None:
        return []
    hosts_of_node, nodes_of_host = defaultdict(set), defaultdict(set)
    for host, node in zip(map(str, run.hostnames), run.node_index.tolist()):
        hosts_of_node[node].add(host)
        nodes_of_host[host].add(node)
    split = [f"host {host} holds MPI nodes {sorted(nodes)}"
             for host, nodes in sorted(nodes_of_host.items()) if len(nodes) > 1]
    merged = [f"MPI node {node} spans hosts {sorted(hosts)}"
              for node, hosts in sorted(hosts_of_node.items()) if len(hosts) > 1]
    if not split and not merged:
        return []
    return [Problem(run.path, "placement", "; ".join(split + merged) + ": MPI's shared-memory "
                    "nodes, which pick each rank's GPU and set the run's nodes × ranks per "
                    "node, are not its hosts", False)]


def _shared_devices(run):
    """Ranks that drove one GPU (one UUID): each then ran at a fraction of it."""
    if run.device_uuid is None:
        return []
    ranks_of_device = defaultdict(list)
    for rank, uuid in enumerate(run.device_uuid):
        if uuid and not uuid.startswith(UNAVAILABLE_PREFIX):
            ranks_of_device[uuid].append(rank)
    shared = [f"ranks {ranks} drove {uuid}" for uuid, ranks in sorted(ranks_of_device.items())
              if len(ranks) > 1]
    if not shared:
        return []
    return [Problem(run.path, "shared device", "; ".join(shared) + ": ranks sharing a GPU "
                    "each ran at a fraction of it", False)]
