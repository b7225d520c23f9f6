"""python -m sweep.serve: ``sweep serve`` (sweep/cli/serve.py), the spelling the manifests and the image run."""

from sweep.cli.serve import main

if __name__ == "__main__":
    main(prog="python -m sweep.serve")
