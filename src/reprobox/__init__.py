"""reprobox: reproducible bug repros for the PyTorch / Hugging Face training stack."""

__version__ = "0.1.0"
