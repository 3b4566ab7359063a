#!/usr/bin/env bash
# Installs what scalestudy needs from Debian/Ubuntu packages when run as root, and
# otherwise names exactly what to install. Sourced by the README's two commands.
set -euo pipefail

SCALESTUDY_PACKAGES=(build-essential cmake git openmpi-bin libopenmpi-dev libhdf5-dev hdf5-tools
                     libboost-program-options-dev libgtest-dev python3 python3-venv python3-pip
                     xz-utils)
# What the tests need beyond that: a headless browser that renders the HTML report, and
# Lmod, under which the sweep's generated scripts load a module.
SCALESTUDY_TEST_PACKAGES=(chromium lmod)

# The packages of SCALESTUDY_PACKAGES, and those given as arguments, not installed.
missing_packages() {
  local missing=()
  for package in "${SCALESTUDY_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
  done
  echo "${missing[@]:-}"
}

# Installs SCALESTUDY_PACKAGES and the packages given as arguments.
install_system_packages() {
  if ! command -v dpkg-query >/dev/null; then
    echo "scalestudy: this installer knows Debian/Ubuntu only; install: ${SCALESTUDY_PACKAGES[*]} $*" >&2
    return 1
  fi
  local missing
  missing=$(missing_packages "$@")
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" = 0 ]; then
    echo "scalestudy: installing $missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
  else
    echo "scalestudy: missing packages. Run as root, or install them with:" >&2
    echo "  sudo apt-get install -y $missing" >&2
    return 1
  fi
}

# A virtual environment for the analysis package, inside the build folder, which also
# holds cudnn-frontend's headers for the CUDA build.
setup_analysis_venv() {
  local venv=$1
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$venv/bin/python" -m pip install -q -e "$SCALESTUDY_ROOT/analysis[test]"
  # cudnn-frontend's C++ headers (its include/ folder), which the CUDA build looks for here
  # to build --attention-kernel cudnn; without dependencies, as only the headers are used.
  "$venv/bin/python" -m pip install -q --no-deps nvidia-cudnn-frontend
}
