"""Ray Tune sweeps over the training job: search spaces (space.py), the sweep job (sweep.py), results (results.py)."""
