"""What the command-line scripts of jobscripts/ and peers/ share: the usage error and its
exit status, argparse types that refuse out-of-range numbers, what a scalestudy binary says
it can run, and the name of the machine's GPU."""
import argparse
import json
import math
import shutil
import subprocess

USAGE_ERROR = 2


class UsageError(Exception):
    """Bad input from the user: reported in one line, exit code 2."""


def integer_at_least(minimum, what):
    """An argparse type: an integer of at least `minimum`, refused as not being `what`."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value
    return parse


positive_int = integer_at_least(1, "a positive integer")
non_negative_int = integer_at_least(0, "a non-negative integer")


def positive_float(text):
    """An argparse type: a number above zero (not NaN)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def gpu_name():
    """The first GPU's name from nvidia-smi, or "" where there is none."""
    if not shutil.which("nvidia-smi"):
        return ""
    listing = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True).stdout
    return listing.split("\n")[0]


def binary_info(binary, env=None):
    """What `scalestudy info --json` says the binary can run: its backends with their
    precisions, and its presets; run in `env` (default: this process's environment).
    Raises UsageError naming --binary where it does not answer with that description."""
    try:
        out = subprocess.run([str(binary), "info", "--json"], capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise UsageError(f"--binary {binary}: 'info --json' did not answer ({error})") from None
    try:
        if out.returncode != 0:
            raise ValueError(out.stderr.strip() or f"exit status {out.returncode}")
        info = json.loads(out.stdout)
        info["backends"]["cpu"]["precisions"]
        {preset["name"]: preset["vocab"] for preset in info["presets"]}
        return info
    except (ValueError, KeyError, TypeError) as error:
        raise UsageError(f"--binary {binary}: 'info --json' gave no description of what it runs "
                         f"({str(error).splitlines()[0] if str(error) else type(error).__name__}); "
                         "is it a scalestudy binary of this version?") from None
