"""Pure numpy math: norms, tensor statistics, growable series, decimation, smoothing."""
