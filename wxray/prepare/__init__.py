"""The data preparation jobs (`jobs/prepare_data.py`, `make_sample_data.py`, `prepare_obs.py`, `make_sample_obs.py`):
typed configs and their `main` functions over the data layer, above the job plumbing (`wxray/job.py`) that the data
layer never imports."""
