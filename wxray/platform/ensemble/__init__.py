"""Batch ensembles on Ray actors and observing-system experiments."""
