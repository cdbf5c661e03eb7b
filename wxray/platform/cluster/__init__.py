"""Where work runs: the Ray session, scaling, vendor-aware placement, devices and memory."""
