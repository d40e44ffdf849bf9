"""The machine a case runs on, torch imported only inside the probes: the device probe and the
hardware gate per precision mode (device), the provenance record (provenance), the NVML seam
(nvml) and the sourced dense peak rates for MFU (peaks). Imports nothing above it."""
