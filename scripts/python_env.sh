# Sourced by main.sh and test.sh: exports PYTHON, the interpreter every step installs into and
# runs. PYTHON given: that one. Else python3, unless it refuses pip installs (PEP 668: Debian
# 12's or Ubuntu 24.04's own python, "externally-managed-environment"); then the project's
# virtual environment .venv, made on first use over python3 with its site packages visible.
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  if python3 -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))' \
      && [ "$(python3 -c 'import sys; print(sys.prefix == sys.base_prefix)')" = True ]; then
    if [ ! -x .venv/bin/python ]; then
      if ! python3 -m venv --help >/dev/null 2>&1; then  # Debian splits venv out of python3
        SUDO=""
        [ "$(id -u)" -ne 0 ] && SUDO="sudo"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv
      fi
      echo "== python3 refuses pip installs (PEP 668): using the virtual environment .venv"
      python3 -m venv --system-site-packages .venv
    fi
    PYTHON=$(pwd)/.venv/bin/python
  fi
fi
export PYTHON
