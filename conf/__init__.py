"""The Hydra config tree (conf/ in the repository, installed as the package sweep.conf)."""
