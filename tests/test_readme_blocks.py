"""How the README's commands are read for tests/test_readme_commands.py (Ray-free): which blocks run,
which are servers, which are not run and why; and that every sweep line takes the small settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.doc_blocks import bash_blocks, commands, with_overrides

ROOT = Path(__file__).resolve().parents[1]
# A block is not run only for one of these reasons (the README says which, right above the block).
ALLOWED_REASONS = ("the test command itself", "needs a GPU", "needs a Kubernetes cluster", "needs a bucket",
                   "needs a Ray cluster")

PAGE = """\
# A page

<!-- not run: needs a GPU -->
```bash
sweep train.method=qlora
```

```text
sweep not-a-command
```

<!-- background: ready when http://127.0.0.1:5000/health answers -->
```bash
sweep ui out_dir=runs/x
```

```bash
. .venv/bin/activate
sweep 'task=[RTE,MRPC]' model=minilm \\
      out_dir=runs/x   # two tasks
sweep serve --help
python -m sweep task=RTE
```
"""


def test_blocks_are_read_with_their_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    gpu, ui, tour = bash_blocks(page, tmp_path)
    assert (gpu.not_run, gpu.ready_url, gpu.where) == ("needs a GPU", None, "page.md:4")
    assert (ui.not_run, ui.ready_url) == (None, "http://127.0.0.1:5000/health")
    assert (tour.not_run, tour.ready_url) == (None, None)
    assert commands(tour.text) == [". .venv/bin/activate", "sweep 'task=[RTE,MRPC]' model=minilm out_dir=runs/x   "
                                   "# two tasks", "sweep serve --help", "python -m sweep task=RTE"]


def test_only_sweeps_take_the_small_settings() -> None:
    small = ["train.epochs=1"]
    assert with_overrides("sweep 'task=[RTE,MRPC]' out_dir=runs/x  # two", small) == \
        "sweep 'task=[RTE,MRPC]' out_dir=runs/x train.epochs=1"
    assert with_overrides("python -m sweep run task=RTE", small) == "python -m sweep run task=RTE train.epochs=1"
    for other in ("sweep serve model=runs/x/best/RTE", "sweep --help", "cat runs/x/summary.csv", "make demo",
                  "sweep ui out_dir=runs/x"):
        assert with_overrides(other, small) == other
    with pytest.raises(ValueError, match="a line of its own"):
        with_overrides("sweep task=RTE | tee log", small)


def test_every_readme_block_runs_or_says_why_not() -> None:
    blocks = bash_blocks(ROOT / "README.md", ROOT)
    not_run = {block.where: block.not_run for block in blocks if block.not_run is not None}
    unexplained = {where: reason for where, reason in not_run.items()
                   if not any(allowed in reason for allowed in ALLOWED_REASONS)}
    assert not unexplained, f"not run without one of the reasons {ALLOWED_REASONS}: {unexplained}"
    ran = [block for block in blocks if block.not_run is None]
    assert len(ran) >= 5 and len(not_run) <= 3, (len(ran), not_run)  # the README is mostly run
    for block in ran:  # every sweep line takes the small settings; a server is one command
        for command in commands(block.text):
            with_overrides(command, ["train.epochs=1"])
        if block.ready_url:
            assert len(commands(block.text)) == 1 and block.ready_url.startswith("http://127.0.0.1:"), block
    assert any("make test" in block.text and "the test command itself" in (block.not_run or "") for block in blocks)
