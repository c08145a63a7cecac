"""reports/env-vars.md and docs/patches.md are generated from patches.yaml and the code: they
must be in step with it, and every GOVINDA_* switch the code reads must be documented."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from overlay_testing import REPO


@pytest.mark.parametrize("command", ["env-doc", "patch-doc"])
def test_committed_docs_are_current(command, base_env):
    done = subprocess.run([sys.executable, "-m", "govinda_patch", command, "--check"], cwd=REPO, env=base_env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_switch_read_by_the_code_is_documented():
    documented = set(re.findall(r"`(GOVINDA_[A-Z0-9_]+)`", (REPO / "reports" / "env-vars.md").read_text()))
    sources = [REPO / "sitecustomize.py", *REPO.glob("govinda_patch/**/*.py"), *REPO.glob("kernels/*.py"),
               *REPO.glob("scripts/**/*.sh"), *REPO.glob("bench/**/*.py"), REPO / "patches.yaml"]
    used = set()
    for path in sources:
        used |= set(re.findall(r"\b(GOVINDA_[A-Z0-9_]*[A-Z0-9])\b", path.read_text()))
    assert used, "no switches found: the scan is broken"
    assert used - documented == set()
