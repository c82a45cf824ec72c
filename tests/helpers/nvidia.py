"""GPU names as nvidia-smi prints them, for the set-up and backend tests."""

H100 = "NVIDIA H100 80GB HBM3"
