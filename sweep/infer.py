"""python -m sweep.infer: ``sweep infer`` (sweep/cli/infer.py), one inference call to a model server."""

from sweep.cli.infer import main

if __name__ == "__main__":
    main(prog="python -m sweep.infer")
