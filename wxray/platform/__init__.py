"""The Ray layer: datasets, trainer loop, ensemble actors, tracking, accelerators, job plumbing."""
