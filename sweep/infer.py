"""python -m sweep.infer: one inference call to a model server (the code is in sweep/serving/infer.py)."""

from sweep.serving.infer import main

if __name__ == "__main__":
    main()
