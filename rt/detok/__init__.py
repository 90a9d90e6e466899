"""The detokenizer's pure core: incremental decoding and stop strings."""
