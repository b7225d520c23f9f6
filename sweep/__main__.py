"""python -m sweep: the ``sweep`` command (sweep/cli/main.py); ``python -m sweep <overrides>`` is ``sweep run``.

``cli`` is the console script of installs made while it was named ``sweep.__main__:cli``.
"""

from sweep.cli.main import main as cli

if __name__ == "__main__":
    cli(prog="python -m sweep")
