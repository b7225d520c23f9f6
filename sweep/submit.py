"""python -m sweep.submit --address http://HEAD:8265 -- <overrides>: the sweep as a Ray Job (see sweep.run.submit)."""
from sweep.run.submit import main

if __name__ == "__main__":
    main()
