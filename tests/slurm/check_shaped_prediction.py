"""Checks scalestudy-predict's held-out prediction across the shaped link: fitted on the
one-node point (N = 1, one rank per node), its prediction of the 2-rank point (two nodes)
must lie within the bound; prints the error with communication's share of the measured
step.
  check_shaped_prediction.py PREDICTIONS_JSON RESULTS_DIR BOUND RATE"""
import json
import pathlib
import statistics
import sys

import h5py


def main(argv):
    predictions, results, bound, rate = argv[0], pathlib.Path(argv[1]), float(argv[2]), argv[3]
    document = json.loads(pathlib.Path(predictions).read_text())
    # What communication takes of the measured 2-rank step: the shaping must make it large.
    shares = []
    for path in results.rglob("n2-*.h5"):
        with h5py.File(path, "r") as handle:
            shares.append(float(handle["summary"].attrs["comm_fraction_of_step"]))
    # Below this share the check would weigh the model's compute more than its network terms.
    least_share = 0.75
    if not shares or statistics.median(shares) < least_share:
        listed = ", ".join(f"{100 * share:.0f} %" for share in shares)
        print(f"FAIL: shaped {rate}: communication is {listed} of the measured 2-rank steps, "
              f"below {100 * least_share:.0f} %: the link does not decide the step")
        return 1
    checks = document["held_out"]
    if not checks or any(c["predicted_N"] != 2 or c["fit_N"] != [1] for c in checks):
        print(f"FAIL: shaped {rate}: no held-out prediction of N = 2 from N = 1: {checks}")
        return 1
    status = 0
    for check in checks:
        error = check["signed_error"]
        print(f"shaped {rate}: {check['strategy']}, fitted on N = 1, predicts N = 2 across "
              f"the link at {100 * error:+.1f} % (bound {100 * bound:.0f} %): "
              f"{check['predicted_step_s'] * 1e3:.1f} ms predicted, "
              f"{check['measured_step_s'] * 1e3:.1f} ms measured, communication "
              f"{100 * statistics.median(shares):.0f} % of the measured step")
        if abs(error) > bound:
            print(f"FAIL: shaped {rate}: {100 * error:+.1f} % beyond the bound")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
