"""A run from its flags: the flag schema and its validation (training_args.py), the run assembled from it
(run_setup.py) and the record of it (run_record.py, args.json)."""
