"""python -m sweep.submit: ``sweep submit`` (sweep/cli/submit.py), the sweep as a Ray Job on a running cluster."""

from sweep.cli.submit import main

if __name__ == "__main__":
    main(prog="python -m sweep.submit")
