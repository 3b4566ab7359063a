"""What the command-line scripts of jobscripts/ share: the usage error and its exit status,
argparse types that refuse out-of-range numbers, and the name of the machine's GPU."""
import argparse
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
