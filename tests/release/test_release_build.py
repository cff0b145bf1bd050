"""The library as `pip install .` builds it carries no test switch (CMake's
INSTANTTENSOR_TESTING_HOOKS off): no fault injection, no fence dropping, and every
INSTANTTENSOR_TESTING_* variable ignored. scripts/test.sh runs this right after the release
install (scripts/build.sh), before it installs the testing build the other suites need."""

import os
import sys

import pytest
import torch

from instanttensor import _library

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from test_distributed import checkpoint, run_ranks  # noqa: E402,F401  (fixture and helper)

pytestmark = pytest.mark.skipif(
    os.environ.get("INSTANTTENSOR_RELEASE_CHECK") != "1",
    reason="scripts/test.sh runs this against the release install (INSTANTTENSOR_RELEASE_CHECK=1)")


def test_the_build_says_it_has_no_testing_hooks():
    assert "testing-hooks" not in torch.ops.instanttensor.build_info()


def test_the_library_holds_no_test_switch():
    # Code that reads a variable holds its name; code that arms faults exports arm_faults.
    data = open(_library.load_library(), "rb").read()
    assert data.count(b"INSTANTTENSOR_TESTING_") == 0
    assert data.count(b"arm_faults") == 0  # disarm_faults too


def test_testing_variables_change_nothing(tmp_path, checkpoint):
    # With the hooks, each of these changes a load: an unparsable step-round stride fails the
    # open of ranks reading alone, the trace writes a file per rank, the host identities split
    # the ranks into two hosts (which the stats say), a dropped fence skips a wait.
    paths, expected, _ = checkpoint
    trace = str(tmp_path / "trace")
    env = {"INSTANTTENSOR_TESTING_STEP_ROUND_BYTES": "not-a-size",
           "INSTANTTENSOR_TESTING_TRACE_COLLECTIVES": trace,
           "INSTANTTENSOR_TESTING_DROP_FENCE": "landed"}
    hosts = {"0": {"INSTANTTENSOR_TESTING_HOST_ID": "a"}, "1": {"INSTANTTENSOR_TESTING_HOST_ID": "b"}}
    for exchange in ["never", "always"]:
        results = run_ranks(tmp_path, [paths] * 2, {"copy": True, "backend": "pread"},
                            timeout=120, env={**env, "INSTANTTENSOR_EXCHANGE": exchange.upper()},
                            rank_env=hosts)
        for result in results:
            assert "error" not in result, result["error"]
            assert result["digests"] == expected
            if exchange == "never":  # one host, whatever the identities say
                assert "2 ranks on this host" in result["stats"]["backend"]
        assert not [f for f in os.listdir(tmp_path) if f.startswith("trace")]
