"""``scripts/bench_load.py`` in its smallest mode: the guarded server pair under a short Locust load with abusive
requests in it (a 10 MB body, a keyless request, too many tokens) answers each as it must, no 5xx, and still
serves after it. No Ray."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "scripts" / "bench_load.py"


@pytest.mark.slow
def test_a_short_load_with_abuse_in_it_gets_no_5xx(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    # 4 users, 3 s measured: under a minute on 2 busy cores (the two servers' start is much of it). Abusive
    # kinds at weight 10 each against 20 per normal route, so that even a slow run sends several of each.
    done = subprocess.run([sys.executable, str(BENCH), "--users", "4", "--duration", "3", "--warmup", "1",
                           "--repeats", "1", "--modes", "guarded+abuse", "--abuse-weight", "10", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["five_xx"] == 0 and result["failures"] == []
    [cell] = result["cells"]
    assert cell["mode"] == "guarded+abuse" and cell["no_answer"] == 0 and cell["unexpected"] == {}
    statuses = cell["statuses"]
    assert statuses["oversized"].get("413", 0) > 0 and set(statuses["oversized"]) == {"413"}
    assert statuses["no_key"].get("401", 0) > 0 and set(statuses["no_key"]) == {"401"}
    assert statuses["too_many_tokens"].get("400", 0) > 0 and set(statuses["too_many_tokens"]) == {"400"}
    assert set(statuses["classify"]) == {"200"} and set(statuses["complete"]) == {"200"}
    # after the load: health and a normal request 200, a 10 MB body 413, a keyless request 401
    [step] = result["steps"]
    assert {label: c["status"] for label, c in step["check"].items()} == {
        "classifier ready": 200, "lm ready": 200, "classify": 200, "complete": 200, "oversized": 413, "no_key": 401}
    assert all(mib > 0 for mib in step["rss_after"].values())
