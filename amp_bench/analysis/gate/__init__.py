"""The nightly regression gate: change-point segmentation (changepoints), the series of every case
per machine (history), accepted changes (annotations) and the shared-tree gate (nightly)."""
