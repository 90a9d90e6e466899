"""The tokenizer worker's pure core: prompts to validated token ids, in batches."""
