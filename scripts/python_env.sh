# Sourced by main.sh, test.sh and test_callers.sh right after they cd to the checkout: exports
# PYTHON, the interpreter every step installs into and runs. PYTHON given: that one (a relative
# path is taken from where the script was started). Else python3, unless it refuses pip installs
# (PEP 668: Debian 12's or Ubuntu 24.04's own python, "externally-managed-environment"); then the
# project's virtual environment .venv, made on first use over python3 with its site packages
# visible.
if [ -n "${PYTHON:-}" ]; then
  case $PYTHON in
    /*) ;;
    */*) PYTHON="${OLDPWD:-$(pwd)}/$PYTHON" ;;
  esac
else
  PYTHON=python3
  if python3 -c 'import os, sys, sysconfig
managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
sys.exit(not (managed and sys.prefix == sys.base_prefix))'; then
    if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
      rm -rf .venv
      if ! python3 -c 'import ensurepip' 2>/dev/null; then  # Debian ships it in python3-venv
        SUDO=""
        [ "$(id -u)" -ne 0 ] && SUDO="sudo"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv
      fi
      echo "== python3 refuses pip installs (PEP 668): using the virtual environment .venv"
      python3 -m venv --system-site-packages .venv || { rm -rf .venv; exit 1; }
    fi
    PYTHON=$(pwd)/.venv/bin/python
  fi
fi
export PYTHON
