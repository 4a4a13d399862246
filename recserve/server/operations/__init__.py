"""Running the server: flags, assembly, workers, ports, metrics, and model control (admin, reload, follow)."""
