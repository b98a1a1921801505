"""How a run is measured: the shared loop (loop), its statistics and MFU (metrics), the
peak FLOP/s it is compared with (peak), TensorBoard scalars and TF step traces."""
