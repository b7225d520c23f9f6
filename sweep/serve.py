"""python -m sweep.serve: serve a fine-tuned model over KServe's protocols (the code is in sweep/serving/serve.py)."""

from sweep.serving.serve import main

if __name__ == "__main__":
    main()
