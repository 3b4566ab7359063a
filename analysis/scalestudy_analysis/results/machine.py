"""What a run ran on and what built it: device model, topology, links (emulated or not,
and NCCL's transports), build (sha and dirty flag), and for the CPU backend the host's
CPU model, logical cores and each rank's binding.
Series never pool runs that differ in any of these (docs/results-schema.md, "How the
analysis groups runs"); files before version 5 lack the host's cores, binding and CPU
model, which then read as unknown."""
from collections import Counter

import numpy as np

from scalestudy_analysis.results.schema import (LINK_EMULATION_ATTRIBUTE, TRANSPORT_NONE, TRANSPORT_UNKNOWN,
                     TRANSPORTS_ATTRIBUTE)

UNKNOWN = "unknown"
DIRTY_SUFFIX = "-dirty"


def _joined(values):
    """One text for the distinct values of a per-rank list, sorted."""
    distinct = sorted({str(value) for value in values})
    return " + ".join(distinct) if distinct else UNKNOWN


def device_model(run):
    """The devices' names ("NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)", or "cpu"), joined
    when the ranks differ."""
    return _joined(run.devices)


def is_dirty(run):
    """The root attribute git_dirty where the file has it (version 5), else the "-dirty"
    suffix that older files append to git_sha."""
    flag = run.attrs.get("git_dirty")
    if flag is None:
        return str(run.git_sha).endswith(DIRTY_SUFFIX)
    if isinstance(flag, str):
        return flag.strip().lower() in ("1", "true", "yes", "on")
    return bool(flag)


def build(run):
    """The commit with -dirty appended when the tree had local changes: two files of
    one commit, one built clean and one dirty, are two builds."""
    sha = str(run.git_sha)
    if sha.endswith(DIRTY_SUFFIX):
        sha = sha[: -len(DIRTY_SUFFIX)]
    return sha + (DIRTY_SUFFIX if is_dirty(run) else "")


def nodes(run):
    """The run's node count; 1 where the file does not record it."""
    return int(run.attrs.get("nodes", 1))


def ranks_per_node(run):
    """Ranks per node; the world size (one node) where the file does not record it."""
    return int(run.attrs.get("ranks_per_node", _world_size(run)))


def topology(run):
    """"nodes × ranks per node", as written in the report."""
    return f"{nodes(run)}×{ranks_per_node(run)}"


def topology_words(nodes_, ranks_per_node_):
    """"2 nodes × 2 ranks", as the report's text says it."""
    return (f"{nodes_} node{'s' if nodes_ != 1 else ''} × {ranks_per_node_} "
            f"rank{'s' if ranks_per_node_ != 1 else ''}")


def link_emulation(run):
    """--link-emulation: "none" or "socket"; "none" in files before version 8, which
    predate it. run: a run, or anything with the root attributes as .attrs (a bench file)."""
    return str(run.attrs.get(LINK_EMULATION_ATTRIBUTE, "none"))


def emulated(run):
    """Whether the run used --link-emulation (anything but "none")."""
    return link_emulation(run) != "none"


def transports(run):
    """NCCL's transports as the run measured them ("NET/Socket,P2P"), "none" where no rank
    connected through any (one rank, the cpu backend), "unknown" where the file does not
    know (before version 8 on cuda, or NCCL's log was the user's)."""
    value = run.attrs.get(TRANSPORTS_ATTRIBUTE)
    if value is not None:
        return str(value)
    return TRANSPORT_NONE if str(run.attrs.get("backend")) == "cpu" else TRANSPORT_UNKNOWN


def _world_size(run):
    return int(run.attrs.get("world_size", 1))


def comm_scope(run):
    """Where a run's collectives run: "inter-node" when its ranks span nodes, or when an
    emulation stands in for separate nodes; "intra-node" on one node; None on one rank,
    which exchanges nothing. Every collective runs on the world communicator, so it spans
    what the ranks span."""
    if _world_size(run) <= 1:
        return None
    return "inter-node" if nodes(run) > 1 or emulated(run) else "intra-node"


def link_kind(run):
    """The links between a run's ranks as the report names them: "emulated inter-node
    (NET/Socket)", "P2P", "NET/IB + P2P", "MPI (cpu backend)", "unknown"; None on one rank.
    An emulated run is always named so, whatever NCCL chose."""
    if _world_size(run) <= 1:
        return None
    if str(run.attrs.get("backend")) == "cpu":
        return "MPI (cpu backend)"
    measured = transports(run)
    shown = "transport unknown" if measured == TRANSPORT_UNKNOWN else " + ".join(measured.split(","))
    if emulated(run):
        return f"emulated inter-node ({shown})"
    return shown if measured != TRANSPORT_UNKNOWN else TRANSPORT_UNKNOWN


def packing(run):
    """The ranks per node of a run spread over several nodes, or None on one node (which
    fits any packing of at least world_size ranks per node). An uneven spread is named by
    its topology."""
    if nodes(run) <= 1:
        return None
    if nodes(run) * ranks_per_node(run) == run.world_size:
        return str(ranks_per_node(run))
    return f"uneven {topology(run)}"


def packing_capacity(value):
    """The most ranks one node holds under a packing named by packing()."""
    return int(value.rsplit("×", 1)[-1]) if value.startswith("uneven") else int(value)


def cpu_model(run):
    """The hosts' CPU models as one text ("A + B" for unlike hosts); "unknown" where the file
    does not record them (before version 5)."""
    return _joined(run.cpu_model) if run.cpu_model is not None else UNKNOWN


def logical_cores_by_host(run):
    """{hostname: logical cores} from /ranks/logical_cores (version 5); None when the
    file does not record them or a rank's count is not positive."""
    if run.logical_cores is None:
        return None
    cores = {}
    for host, count in zip(run.hostnames, np.asarray(run.logical_cores).ravel()):
        if not (np.isfinite(count) and count > 0):
            return None
        cores[str(host)] = int(count)
    return cores


def logical_cores(run):
    """The hosts' logical cores as one text ("8", or "8 + 16" for unlike hosts)."""
    by_host = logical_cores_by_host(run)
    return UNKNOWN if by_host is None else _joined(by_host.values())


def ranks_by_host(run):
    """Counter of the run's ranks per hostname."""
    return Counter(str(host) for host in run.hostnames)


# The CPU backend's MPI communicator runs each rank's collectives on a worker thread of
# its own beside the compute thread (src/comm/mpi_communicator.h): two busy threads a
# rank while communication overlaps compute.
CPU_THREADS_PER_RANK = 2


def host_cores(run):
    """{hostname: logical cores} from /ranks/logical_cores; {} where the file does not
    record them (before version 5): no guess from the machine reading the file, whose
    host name may be as generic as the one that wrote it."""
    return logical_cores_by_host(run) or {}


def oversubscribed_hosts(run, threads_per_rank=1):
    """[(host, ranks, cores)] for each host where ranks × threads_per_rank exceed its
    recorded logical cores."""
    cores = host_cores(run)
    return [(host, count, cores[host]) for host, count in sorted(ranks_by_host(run).items())
            if host in cores and count * threads_per_rank > cores[host]]


def parse_cpu_list(text):
    """The cores of a Linux CPU list ("0-3,8,10-11"); None when it names none or does
    not parse (an unbound rank may record "")."""
    cores = set()
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return None
        cores.update(range(int(low), int(high or low) + 1))
    return cores or None


def shared_bindings(run):
    """[(host, core)] of the cores that two bound ranks of one host share; [] when the
    bindings are disjoint, None when the file records none (before version 5). Unbound
    ranks (unbound_ranks) are left out: they share every core by design."""
    if run.cpu_binding is None:
        return None
    unbound = set(unbound_ranks(run))
    seen, shared = set(), set()
    for rank, (host, text) in enumerate(zip(run.hostnames, run.cpu_binding)):
        if rank in unbound:
            continue
        for core in parse_cpu_list(text):
            key = (str(host), core)
            if key in seen:
                shared.add(key)
            seen.add(key)
    return sorted(shared)


def unbound_ranks(run):
    """The ranks free to run on every core of their host (a binding that is empty, does
    not parse, or covers all the host's logical cores); None before version 5."""
    if run.cpu_binding is None:
        return None
    cores = logical_cores_by_host(run) or {}
    unbound = []
    for rank, (host, text) in enumerate(zip(run.hostnames, run.cpu_binding)):
        listed = parse_cpu_list(text)
        if listed is None or (str(host) in cores and len(listed) >= cores[str(host)]):
            unbound.append(rank)
    return unbound


def describe(run):
    """What sets a run's machine and build apart, by name, as the series keys use it.
    The CPU's model and cores matter for the CPU backend only, where they are the
    device."""
    values = {"device": device_model(run), "backend": str(run.attrs.get("backend", UNKNOWN)),
              "git_sha": build(run), "link_emulation": link_emulation(run)}
    if values["backend"] == "cpu":
        values["cpu_model"] = cpu_model(run)
        values["logical_cores"] = logical_cores(run)
    return values

