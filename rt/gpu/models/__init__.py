"""Model code (torch) for the Llama family, and the null model."""
