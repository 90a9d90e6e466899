"""Triton kernels, each with its torch reference and launcher."""
